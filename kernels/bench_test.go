package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

func randomNVFP4(rng *rand.Rand, n, k int) *quant.NVFP4 {
	q := &quant.NVFP4{Rows: n, Cols: k, Packed: make([]byte, n*k/2), Scales: make([]byte, n*k/16), GlobalScale: 1e-3}
	for i := range q.Packed {
		q.Packed[i] = byte(rng.Uint32())
	}
	for i := range q.Scales {
		q.Scales[i] = quant.Float32ToE4M3(float32(0.5 + rng.Float64()))
	}
	return q
}

// BenchmarkGEMV times the NVFP4, bf16 and f32 matmuls at decode shapes
// (m = 1) and small batches, and reports the weight bytes streamed per second
// as a fraction of the copy bandwidth measured in the same run.
func BenchmarkGEMV(b *testing.B) {
	g := newGPU(b)
	copyBW := g.CopyBandwidth()
	b.Logf("device copy bandwidth (read+write): %.0f GB/s", copyBW/1e9)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, shape := range [][2]int{{4096, 14336}, {14336, 4096}} {
		N, K := shape[0], shape[1]
		q := randomNVFP4(rng, N, K)
		bf := make([]byte, 2*N*K)
		for i := range bf {
			bf[i] = byte(rng.Uint32() & 0x3f) // small finite bf16 values
		}
		for _, h := range []*backend.HostWeight{
			{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q},
			{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf},
		} {
			w, err := g.Upload(h)
			if err != nil {
				b.Fatal(err)
			}
			for _, m := range []int{1, 16, 64} {
				b.Run(fmt.Sprintf("%s/%dx%d/m=%d", h.Name, N, K, m), func(b *testing.B) {
					x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
					g.MatMul(y, x, w, m)
					d := deviceTime(g, 50, func() { g.MatMul(y, x, w, m) })
					bytes := float64(N*K) * h.Format.BytesPerValue()
					b.ReportMetric(float64(d.Microseconds()), "us/op")
					b.ReportMetric(bytes/d.Seconds()/1e9, "weight-GB/s")
					b.ReportMetric(bytes/d.Seconds()/copyBW, "of-copy-bw")
					fmt.Printf("RESULT gemv %s N=%d K=%d m=%d time_us=%.2f weight_GBps=%.0f of_copy=%.3f\n", h.Name, N, K, m,
						float64(d.Nanoseconds())/1e3, bytes/d.Seconds()/1e9, bytes/d.Seconds()/copyBW)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}
