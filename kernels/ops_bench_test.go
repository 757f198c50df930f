package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// Per-op timings of the architecture ops, GPU against the CPU backend, at
// DeepSeek-V4 (mHC n = 4, C = 7168) and V3.2 (DSA decode: 128 heads,
// kv_lora 512, rope 64, top-k 2048; indexer 64 heads of 128) shapes. GPU
// iterations are queued back to back and synchronized once, so ns/op is
// device time plus launch overhead. Run on the device machine:
//
//	kernels.test -test.run '^$' -test.bench Ops -test.benchtime 20x

type opsBackend interface {
	backend.Backend
	backend.HyperConnectionOps
	backend.SparseMLAOps
}

func opsBackends(b *testing.B) []opsBackend {
	return []opsBackend{newGPU(b), refCPU()}
}

func upload(be backend.Backend, v []float32) backend.Buffer {
	x := be.NewBuffer(len(v))
	be.Write(x, 0, v)
	return x
}

func BenchmarkOpsMHC(b *testing.B) {
	const n, C = 4, 7168
	rng := rand.New(rand.NewPCG(1, 1))
	cfg := mhc.Config{Streams: n, Hidden: C, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6}
	mx, _ := mhc.New(cfg)
	mix := cfg.MixDim()
	h := hostWeight(rng, backend.BF16, mix, n*C)
	h.Bias = nil
	for _, be := range opsBackends(b) {
		for _, rows := range []int{1, 64, 8192} {
			if _, ok := be.(*cpu.Backend); ok && rows > 64 {
				continue
			}
			x := upload(be, randn(rng, rows*n*C))
			out := upload(be, randn(rng, rows*C))
			w, err := be.Upload(h)
			if err != nil {
				b.Fatal(err)
			}
			logits := be.NewBuffer(rows * mix)
			pre, post, res := upload(be, randn(rng, rows*n)), upload(be, randn(rng, rows*n)), upload(be, randn(rng, rows*n*n))
			base, scale := upload(be, randn(rng, mix)), upload(be, []float32{0.5, 0.5, 0.5})
			dst := be.NewBuffer(rows * C)
			name := fmt.Sprintf("%s/B=%d/", be.Name()[:3], rows)
			// Bytes that must move: the stream once, plus the output.
			run := func(op string, bytes int, fn func()) {
				b.Run(name+op, func(b *testing.B) {
					b.SetBytes(int64(bytes))
					for range b.N {
						fn()
					}
					if err := be.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
			if rows <= 64 { // the projection is a plain GEMV here, not a prefill GEMM
				run("coeffs", 4*rows*n*C+2*mix*n*C, func() {
					be.MHCProject(logits, x, w, rows, 1e-6)
					be.MHCActivate(mx, pre, post, res, logits, base, scale, rows)
				})
			}
			run("pre", 4*rows*(n+1)*C, func() { be.MHCPre(dst, x, pre, rows, n, C) })
			run("post", 4*rows*(2*n+1)*C, func() { be.MHCPost(x, x, out, post, res, rows, n, C) })
		}
	}
}

func BenchmarkOpsDSADecode(b *testing.B) {
	s := layers.MLAShape{Heads: 128, QLoraRank: 1536, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128}
	ix := dsa.IndexerShape{Heads: 64, HeadDim: 128, RopeDim: 64, TopK: 2048}
	rng := rand.New(rand.NewPCG(2, 2))
	for _, be := range opsBackends(b) {
		for _, L := range []int{8192, 32768} {
			if _, ok := be.(*cpu.Backend); ok && L > 8192 {
				continue
			}
			q := upload(be, randn(rng, s.Heads*s.QKDim()))
			qLat := upload(be, randn(rng, s.Heads*s.KVLoraRank))
			lat := upload(be, randn(rng, L*s.KVLoraRank))
			kr := upload(be, randn(rng, L*s.RopeDim))
			iq := upload(be, randn(rng, ix.Heads*ix.HeadDim))
			iw := upload(be, randn(rng, ix.Heads))
			ik := upload(be, randn(rng, L*ix.HeadDim))
			out := be.NewBuffer(s.Heads * s.KVLoraRank)
			idx, err := be.NewIndices(ix)
			if err != nil {
				b.Fatal(err)
			}
			be.IndexerSelect(idx, iq, iw, ik, 1, L, L-1)
			name := fmt.Sprintf("%s/ctx=%d/", be.Name()[:3], L)
			b.Run(name+"select", func(b *testing.B) {
				b.SetBytes(int64(4 * L * ix.HeadDim))
				for range b.N {
					be.IndexerSelect(idx, iq, iw, ik, 1, L, L-1)
				}
				if err := be.Sync(); err != nil {
					b.Fatal(err)
				}
			})
			b.Run(name+"attend-latent", func(b *testing.B) {
				b.SetBytes(int64(4 * ix.TopK * (s.KVLoraRank + s.RopeDim)))
				for range b.N {
					be.SparseLatentAttention(out, qLat, q, lat, kr, idx, 1, s, 0.1)
				}
				if err := be.Sync(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
