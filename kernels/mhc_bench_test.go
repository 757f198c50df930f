package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// BenchmarkMHCFused times the fused projection alone (MHCProject: the stream
// read once, the bf16 weight once) and MHCCoeffsPre (projection, activation
// and pre; its floor counts the stream read once and the layer input
// written, so pre's second read shows as the gap) at n = 4, C = 7168,
// against the bandwidth floor, like
// BenchmarkOpsFloorMHC. On the device machine, in kernels/:
//
//	kernels.test -test.run '^$' -test.bench MHCFused -test.benchtime 3x
func BenchmarkMHCFused(b *testing.B) {
	const n, C = 4, 7168
	g, bw := floorGPU(b)
	rng := rand.New(rand.NewPCG(11, 2))
	cfg := mhc.Config{Streams: n, Hidden: C, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6}
	mx, _ := mhc.New(cfg)
	mix := cfg.MixDim()
	h := hostWeight(rng, backend.BF16, mix, n*C)
	h.Bias = nil
	w, err := g.Upload(h)
	if err != nil {
		b.Fatal(err)
	}
	for _, rows := range []int{1, 8, 64, 1024, 8192} {
		x := g.NewBuffer(rows * n * C)
		fillRandom(g, rng, ptr(x), rows*n*C)
		logits := g.NewBuffer(rows * mix)
		pre, post, res := g.NewBuffer(rows*n), g.NewBuffer(rows*n), g.NewBuffer(rows*n*n)
		base, scale := toGPU(g, randn(rng, mix)), toGPU(g, []float32{0.5, 0.5, 0.5})
		dst := g.NewBuffer(rows * C)
		iters := 20
		if rows > 64 {
			iters = 3
		}
		b.Run(fmt.Sprintf("B=%d/project", rows), func(b *testing.B) {
			timeOp(b, g, bw, iters, float64(4*rows*n*C+2*mix*n*C), func() { g.MHCProject(logits, x, w, rows, 1e-6) })
		})
		b.Run(fmt.Sprintf("B=%d/coeffs+pre", rows), func(b *testing.B) {
			timeOp(b, g, bw, iters, float64(4*rows*n*C+2*mix*n*C+4*rows*C), func() {
				g.MHCCoeffsPre(mx, dst, pre, post, res, logits, x, w, base, scale, rows)
			})
		})
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}
