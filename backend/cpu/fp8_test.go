package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// BenchmarkMatMulBlockScaled times the row-decoding matmul of the formats
// DeepSeek-V4 ships (FP8 with 128x128 E8M0 tiles; MXFP4) at a routed
// expert's shape, for a decode step (m = 1) and a short prefill (m = 16),
// against NVFP4's fused kernel on the same values.
func BenchmarkMatMulBlockScaled(b *testing.B) {
	const N, K = 2048, 4096
	rng := rand.New(rand.NewPCG(1, 1))
	w := randn(rng, N*K)
	fp8, err := quant.QuantizeFP8Block(w, N, K, 128, 128, quant.ScaleE8M0)
	if err != nil {
		b.Fatal(err)
	}
	mx, err := quant.QuantizeMXFP4(w, N, K)
	if err != nil {
		b.Fatal(err)
	}
	nv, err := mx.ToNVFP4()
	if err != nil {
		b.Fatal(err)
	}
	be := New(0)
	for _, h := range []*backend.HostWeight{
		{Name: "fp8block", Rows: N, Cols: K, Format: backend.FP8Block, FP8: fp8},
		{Name: "mxfp4", Rows: N, Cols: K, Format: backend.MXFP4, MX: mx},
		{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: nv},
	} {
		wt, err := be.Upload(h)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/m=%d", h.Name, m), func(b *testing.B) {
				x, out := be.NewBuffer(m*K), be.NewBuffer(m*N)
				be.Write(x, 0, randn(rng, m*K))
				for b.Loop() {
					be.MatMul(out, x, wt, m)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(m), "ns/row")
			})
		}
	}
}
