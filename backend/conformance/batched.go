package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
)

// batchedCases are the NVFP4 matmuls of a batched decode step (issue 60):
// m = 2..256 sequences, one row each, at widths that are multiples of 512,
// 256 and 128 (the GEMM's stages on the GPU: gemm.go's gemmPick) and
// feature counts off its 128-feature tiles. On the CUDA backend they reach
// each token tile the GEMM has: 8, 16, 32 and 64 tokens in stages of 512
// elements (a grid of at least 4/5 of the multiprocessors: 13600 features,
// or 4096 with K split 4 ways at m <= 16), of 256 and of 128, and past 64
// tokens the two-feature-group tile, with m off every tile.
func batchedCases() []Case {
	var cs []Case
	for _, s := range [][3]int{
		{2, 4096, 2048}, {13, 4096, 2048}, // K split: stages of 512, tiles of 8 and 16 tokens
		{24, 13600, 512}, {40, 13600, 512}, // a wide grid: stages of 512, tiles of 32 and 64
		{5, 200, 1024}, {20, 200, 1024}, {33, 200, 1024}, // stages of 256, tiles of 8, 32, 64
		{100, 300, 768}, {256, 520, 1024}, // past 64 tokens: two feature groups a warp
		{7, 136, 384}, {14, 136, 384}, {20, 136, 384}, {48, 136, 384}, // stages of 128: tiles of 8, 16, 32, 64
	} {
		m, rows, cols := s[0], s[1], s[2]
		cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("batched/nvfp4/m=%d/%dx%d", m, rows, cols), Tol: 4e-3, Q8Tol: nvfp4Q8Tol,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return matmul(b, rng, backend.NVFP4, m, rows, cols, false)
			}})
	}
	return cs
}

// sampleCases are BatchTokenSampler.SampleTokens over the rows of a batched
// step's logits: greedy and top-k draws mixed, rows skipped and picked out
// of order, k up to MaxSampleTopK, ties (logits rounded to a coarse grid)
// going to the lower id, vocabularies off the GPU's 64 slices. The ids must
// be exactly the reference's (backend/cpu.SampleToken).
func sampleCases() []Case {
	var cs []Case
	for _, c := range []struct {
		rows, vocab int
		coarse      bool // logits on a grid of 1/4: many ties
	}{{3, 1000, false}, {9, 32003, false}, {5, 777, true}, {40, 4096, false}} {
		cs = append(cs, Case{Op: "BatchTokenSampler.SampleTokens", Shape: fmt.Sprintf("rows=%d/vocab=%d/ties=%v", c.rows, c.vocab, c.coarse), Needs: "BatchTokenSampler",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				logits := rnd(rng, c.rows*c.vocab, 3)
				if c.coarse {
					for i, v := range logits {
						logits[i] = float32(math.Round(float64(v)*4) / 4)
					}
				}
				var picks []backend.SamplePick
				for _, r := range rng.Perm(c.rows)[:max(1, c.rows-1)] { // every row but one, shuffled
					p := backend.SamplePick{Row: r, U: rng.Float64()}
					switch r % 3 {
					case 1:
						p.Temperature, p.TopK = 0.8, 1+rng.IntN(40)
					case 2:
						p.Temperature, p.TopK = 1.3, backend.MaxSampleTopK-rng.IntN(3)
					}
					picks = append(picks, p)
				}
				ids := make([]int, len(picks))
				if err := caps.BatchSampler.SampleTokens(ids, upload(b, logits), c.vocab, picks); err != nil {
					panic(err)
				}
				got, want := make([]float32, len(picks)), make([]float32, len(picks))
				for i, p := range picks {
					got[i] = float32(ids[i])
					id := must(cpu.SampleToken(logits[p.Row*c.vocab:(p.Row+1)*c.vocab], p.Temperature, p.TopK, p.U))
					want[i] = float32(id)
				}
				return got, want
			}})
	}
	return cs
}
