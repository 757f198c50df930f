package conformance

import (
	"fmt"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// mlaCases are MLA's absorbed path around the latent attention
// (SparseMLAOps.MLAAbsorbQuery and MLAExpandOutput: W_UK and W_UV read from
// kv_b_proj in its stored format), at KV LoRA ranks off the GPU's 128-wide
// mla_absorb blocks, nope and value widths off 8 (mla_expand's warps per
// block), one token and several, kv_b_proj in bf16, NVFP4 and FP8 (E8M0 and
// float32 tile scales; FP8 at a rank past mla_expand's batches too). On the
// CUDA backend each launches mla_absorb and mla_expand.
func mlaCases() []Case {
	return rows([]mlaRow{
		{backend.BF16, 1, layers.MLAShape{Heads: 4, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128}},
		{backend.BF16, 3, layers.MLAShape{Heads: 3, KVLoraRank: 200, NopeDim: 40, RopeDim: 16, VDim: 24}},
		{backend.NVFP4, 2, layers.MLAShape{Heads: 5, KVLoraRank: 272, NopeDim: 32, RopeDim: 16, VDim: 48}},
		{backend.F32, 1, layers.MLAShape{Heads: 2, KVLoraRank: 130, NopeDim: 17, RopeDim: 8, VDim: 9}},
		{backend.FP8Block, 2, layers.MLAShape{Heads: 3, KVLoraRank: 200, NopeDim: 32, RopeDim: 16, VDim: 48}},
		{fp8BlockF32, 1, layers.MLAShape{Heads: 3, KVLoraRank: 200, NopeDim: 32, RopeDim: 16, VDim: 48}},
		// FP8 past the GPU's batches of eight rows (mla_absorb) and of
		// eight columns a lane (mla_expand, from 256 columns), with tails.
		{fp8BlockF32, 2, layers.MLAShape{Heads: 2, KVLoraRank: 544, NopeDim: 20, RopeDim: 16, VDim: 24}},
	}, mlaCase)
}

// mlaRow is m tokens of MLA shape mla, kv_b_proj in format f.
type mlaRow struct {
	f   backend.Format
	m   int
	mla layers.MLAShape
}

func mlaCase(s mlaRow) Case {
	shape := fmt.Sprintf("%s/m=%d/h=%d/rank=%d/nope=%d/rope=%d/v=%d", formatName(s.f), s.m, s.mla.Heads, s.mla.KVLoraRank, s.mla.NopeDim, s.mla.RopeDim, s.mla.VDim)
	return Case{Op: "SparseMLAOps.MLAAbsorbQuery,MLAExpandOutput", Shape: shape, Tol: 2e-5, Needs: "SparseMLAOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			ms := s.mla
			r, qk, per := ms.KVLoraRank, ms.QKDim(), ms.NopeDim+ms.VDim
			kvB, hw := weight(rng, s.f, ms.Heads*per, r)
			w := must(b.Upload(hw))
			q, ol := rnd(rng, s.m*ms.Heads*qk, 1), rnd(rng, s.m*ms.Heads*r, 1)
			wantLat, wantOut := make([]float32, s.m*ms.Heads*r), make([]float32, s.m*ms.Heads*ms.VDim)
			for i := range s.m {
				for h := range ms.Heads {
					for j := range r { // W_UK[h]ᵀ q_nope, in float64
						var d float64
						for c := range ms.NopeDim {
							d += float64(q[(i*ms.Heads+h)*qk+c]) * float64(kvB[(h*per+c)*r+j])
						}
						wantLat[(i*ms.Heads+h)*r+j] = float32(d)
					}
				}
				// W_UV[h] outLat: the value rows of kv_b_proj.
				for h := range ms.Heads {
					refMatMul(wantOut[(i*ms.Heads+h)*ms.VDim:], ol[(i*ms.Heads+h)*r:], kvB[(h*per+ms.NopeDim)*r:], nil, 1, ms.VDim, r, r, ms.VDim)
				}
			}
			lat, out := b.NewBuffer(len(wantLat)), b.NewBuffer(len(wantOut))
			caps.SparseMLA.MLAAbsorbQuery(lat, upload(b, q), w, s.m, ms)
			caps.SparseMLA.MLAExpandOutput(out, upload(b, ol), w, s.m, ms)
			return append(read(b, lat), read(b, out)...), append(wantLat, wantOut...)
		}}
}
