//go:build manifold_dev

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/quant"
)

// BenchmarkFP8TensorCores measures the two candidates for FP8 matmuls at
// prefill sizes (issue 58: Hopper's FP8 tensor cores or e4m3 dequantized in
// registers, whichever measures faster): fp8 is the default (gemm_fp8_t*:
// e4m3 widened to fp16 in registers, mma m16n8k16, x in fp16, after fp8_x_h
// at m > 16), fp8q the FP8 tensor cores (fp8_act_quant, then gemm_fp8q_t64:
// mma m16n8k32 e4m3, x quantized to E4M3 per 128-block); both times include
// their conversion of x. Each candidate's error against the CPU backend
// (float32 on the stored weights) is reported first at one shape, as
// err_rel: max |got - want| / max |want|. Needs the dev image (DEV=1
// kernels/gpu.sh run, or MANIFOLD_KERNEL_IMAGE).
func BenchmarkFP8TensorCores(b *testing.B) {
	g := devBenchGPU(b, "gemm_fp8q_t64", false)
	rng := rand.New(rand.NewPCG(58, 2))
	type cand struct {
		name string
		run  func(dst, x *Buffer, w *Weight, m int)
	}
	cands := []cand{
		{"fp8", func(dst, x *Buffer, w *Weight, m int) { g.MatMul(dst, x, w, m) }},
		{"fp8q", func(dst, x *Buffer, w *Weight, m int) {
			if err := g.matmulFP8Q(dst, x, w, m); err != nil {
				b.Fatal(err)
			}
		}},
	}
	{ // accuracy, at one shape
		N, K, m := 1024, 7168, 64
		h := fp8Weight(b, rng, N, K, quant.ScaleF32, false) // float32 scales, as DeepSeek-V3's
		c := cpu.New(runtime.NumCPU())
		wc, wg := uploadBoth(b, g, c, h)
		xv := randn(rng, m*K)
		want := make(cpu.Buffer, m*N)
		c.MatMul(want, cpu.Buffer(xv), wc, m)
		x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
		g.Write(x, 0, xv)
		for _, cd := range cands {
			cd.run(y.(*Buffer), x.(*Buffer), wg.(*Weight), m)
			got := make([]float32, m*N)
			g.Read(got, y, 0)
			if err := g.Sync(); err != nil {
				b.Fatal(err)
			}
			var d, s float64
			for i := range got {
				d = math.Max(d, math.Abs(float64(got[i]-want[i])))
				s = math.Max(s, math.Abs(float64(want[i])))
			}
			fmt.Printf("RESULT fp8_tc %s N=%d K=%d m=%d err_rel=%.2e\n", cd.name, N, K, m, d/s)
		}
	}
	for _, shape := range [][2]int{{18432, 7168}, {7168, 18432}, {4096, 7168}, {24576, 1536}} {
		N, K := shape[0], shape[1]
		h := fp8Weight(b, rng, N, K, quant.ScaleE8M0, false)
		wg, err := g.Upload(h)
		if err != nil {
			b.Fatal(err)
		}
		w := wg.(*Weight)
		for _, m := range []int{64, 256, 512, 2048} {
			x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
			g.Write(x, 0, randn(rng, m*K))
			for _, cd := range cands {
				b.Run(fmt.Sprintf("%s/%dx%d/m=%d", cd.name, N, K, m), func(b *testing.B) {
					cd.run(y.(*Buffer), x.(*Buffer), w, m)
					d := deviceTime(g, 20, func() { cd.run(y.(*Buffer), x.(*Buffer), w, m) })
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
					tf := 2 * float64(m) * float64(N) * float64(K) / d.Seconds() / 1e12
					b.ReportMetric(tf, "TFLOPS")
					fmt.Printf("RESULT fp8_tc %s N=%d K=%d m=%d time_us=%.2f tflops=%.1f\n", cd.name, N, K, m, float64(d.Nanoseconds())/1e3, tf)
				})
			}
		}
	}
}
