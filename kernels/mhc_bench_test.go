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
	g, bw := floorGPU(b)
	m := newMHCBench(b, g, rand.New(rand.NewPCG(11, 2)))
	n, C, mix := mhcBenchN, mhcBenchC, m.mix
	for _, rows := range []int{1, 8, 64, 1024, 8192} {
		r := m.rows(g, rows)
		b.Run(fmt.Sprintf("B=%d/project", rows), func(b *testing.B) {
			timeOp(b, g, bw, r.iters, float64(4*rows*n*C+2*mix*n*C), func() { g.MHCProject(r.logits, r.x, m.w, rows, 1e-6) })
		})
		b.Run(fmt.Sprintf("B=%d/coeffs+pre", rows), func(b *testing.B) {
			timeOp(b, g, bw, r.iters, float64(4*rows*n*C+2*mix*n*C+4*rows*C), func() {
				g.MHCCoeffsPre(m.mx, r.dst, r.pre, r.post, r.res, r.logits, r.x, m.w, m.base, m.scale, rows)
			})
		})
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

// The mHC of the benchmarks: DeepSeek-V4's n = 4 streams of C = 7168.
const mhcBenchN, mhcBenchC = 4, 7168

// mhcBench is that mHC on g: its mixer (20 Sinkhorn iterations), the bf16
// projection weight (no bias), the activation's base and scales.
type mhcBench struct {
	mx          *mhc.Mixer
	w           backend.Weight
	mix         int
	base, scale backend.Buffer
	rng         *rand.Rand
}

func newMHCBench(b *testing.B, g *Backend, rng *rand.Rand) mhcBench {
	cfg := mhc.Config{Streams: mhcBenchN, Hidden: mhcBenchC, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6}
	mx, err := mhc.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	m := mhcBench{mx: mx, mix: cfg.MixDim(), rng: rng}
	h := hostWeight(rng, backend.BF16, m.mix, mhcBenchN*mhcBenchC)
	h.Bias = nil
	if m.w, err = g.Upload(h); err != nil {
		b.Fatal(err)
	}
	m.base, m.scale = toGPU(g, randn(rng, m.mix)), toGPU(g, []float32{0.5, 0.5, 0.5})
	return m
}

// mhcRows are one batch size's buffers: a random stream x, the logits and
// coefficients, the layer input dst; iters is how many calls to time.
type mhcRows struct {
	x, logits, pre, post, res, dst backend.Buffer
	iters                          int
}

func (m mhcBench) rows(g *Backend, rows int) mhcRows {
	n, C := mhcBenchN, mhcBenchC
	r := mhcRows{x: g.NewBuffer(rows * n * C), logits: g.NewBuffer(rows * m.mix), pre: g.NewBuffer(rows * n),
		post: g.NewBuffer(rows * n), res: g.NewBuffer(rows * n * n), dst: g.NewBuffer(rows * C), iters: 20}
	fillRandom(g, m.rng, ptr(r.x), rows*n*C)
	if rows > 64 {
		r.iters = 3
	}
	return r
}
