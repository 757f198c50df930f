package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/quant"
)

// BenchmarkMoEReleased times one decode token (m = 1) through the routed
// experts of the released checkpoints, all of a layer's experts on the GPU
// and the grouped MoE path the models take (BindExperts, RoutedMoE:
// moe_route, moe_up, moe_down over the picked experts):
//
//   - mxfp4: DeepSeek-V4-Flash, 256 experts 4096 -> 2048 -> 4096 in MXFP4,
//     top 6. The GPU runs them re-blocked to NVFP4 (widen: the same codes, 6%
//     more scale bytes), so two rates are given: effective bytes (MXFP4's 17
//     bits a weight over 16: E2M1 codes plus one E8M0 per 32), as issue 58
//     asks, and the bytes the device reads (NVFP4's 9/16 a weight);
//   - nvfp4: the same shape as NVIDIA's NVFP4 checkpoint stores it;
//   - fp8: DeepSeek-V3, 256 experts 7168 -> 2048 -> 7168 in FP8 with 128x128
//     block scales, top 8 (codes plus float32 tile scales, as
//     BenchmarkFP8GEMV counts them);
//   - bf16: Qwen3-30B-A3B, 128 experts 2048 -> 768 -> 2048 in bf16, top 8,
//     routed as Qwen3-MoE does (SoftmaxMoE: moe_softmax_route, moe_up_bf16,
//     moe_down_bf16).
//
// Each token's picks change from run to run (eight router logit sets taken
// in turn), so that the picked experts are not found in L2. The rate is the
// picked experts' bytes over the device time of the three launches, against
// the copy bandwidth of the same run (of_copy; the target of issue 58 is
// 0.8 in effective bytes). RESULT lines as BenchmarkFP8GEMV's. The weights
// stay allocated until the backend closes (3.6, 3.6 and 11.3 GB).
func BenchmarkMoEReleased(b *testing.B) {
	g, bw := floorGPU(b)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", bw/1e9)
	rng := rand.New(rand.NewPCG(58, 6))
	for _, tc := range []struct {
		name       string
		e, k, d, i int
	}{
		{"mxfp4", 256, 6, 4096, 2048},
		{"nvfp4", 256, 6, 4096, 2048},
		{"fp8", 256, 8, 7168, 2048},
		{"bf16", 128, 8, 2048, 768},
	} {
		b.Run(fmt.Sprintf("%s/E=%d/k=%d/%dx%d", tc.name, tc.e, tc.k, tc.d, tc.i), func(b *testing.B) {
			runtime.GC()
			var ws [3][]backend.Weight
			var eff, dev float64 // bytes of one expert's three matrices
			for j, shape := range [][2]int{{tc.i, tc.d}, {tc.i, tc.d}, {tc.d, tc.i}} {
				h, e, d := releasedExpert(b, rng, tc.name, shape[0], shape[1])
				eff, dev = eff+e, dev+d
				for range tc.e {
					w, err := g.Upload(h)
					if err != nil {
						b.Fatal(err)
					}
					ws[j] = append(ws[j], w)
				}
			}
			ex, err := g.BindExperts(ws[0], ws[1], ws[2], randn(rng, tc.e))
			if err != nil || ex == nil {
				b.Fatalf("BindExperts: %v, %v", ex, err)
			}
			a := dsv4.RouteArgs{M: 1, Experts: tc.e, K: tc.k, Scoring: dsv4.ScoreSqrtSoftplus, Scale: 1.5}
			x, out := toGPU(g, randn(rng, tc.d)), g.NewBuffer(tc.d)
			var logits []backend.Buffer
			for range 8 {
				logits = append(logits, toGPU(g, randn(rng, tc.e)))
			}
			qa := layers.SoftmaxRouteArgs{M: 1, Experts: tc.e, K: tc.k, Normalize: true}
			n := 0
			d := timeOp(b, g, bw, 40, float64(tc.k)*eff, func() {
				if tc.name == "bf16" {
					g.SoftmaxMoE(out, x, logits[n%len(logits)], ex, qa)
				} else {
					g.RoutedMoE(out, x, logits[n%len(logits)], nil, ex, a, 10)
				}
				n++
			})
			effBytes, devBytes := float64(tc.k)*eff, float64(tc.k)*dev
			b.ReportMetric(effBytes/d.Seconds()/bw, "of-copy-bw")
			fmt.Printf("RESULT moe %s E=%d k=%d D=%d I=%d m=1 time_us=%.2f eff_MB=%.1f eff_GBps=%.0f of_copy=%.3f dev_MB=%.1f dev_of_copy=%.3f\n",
				tc.name, tc.e, tc.k, tc.d, tc.i, float64(d.Nanoseconds())/1e3, effBytes/1e6, effBytes/d.Seconds()/1e9,
				effBytes/d.Seconds()/bw, devBytes/1e6, devBytes/d.Seconds()/bw)
			if err := g.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// releasedExpert is a random expert matrix [n, k] in the named released
// format, with its effective bytes (as stored in the checkpoint) and the
// bytes the GPU reads of it: MXFP4 (random codes, E8M0 scales of 2^-7 to 2^0)
// uploaded as the checkpoint gives it, which the GPU re-blocks to NVFP4;
// NVFP4 that re-blocking's result; FP8 random E4M3 codes (no NaN) with E8M0
// 128x128 tile scales; bf16 random values of about 2^-7 to 2^1 in magnitude.
func releasedExpert(b *testing.B, rng *rand.Rand, format string, n, k int) (h *backend.HostWeight, eff, dev float64) {
	b.Helper()
	mx := &quant.MXFP4{Rows: n, Cols: k, Packed: make([]byte, n*k/2), Scales: make([]byte, n*k/32)}
	repeatMiB(mx.Packed, func() byte { return byte(rng.Uint32()) })
	for i := range mx.Scales {
		mx.Scales[i] = byte(120 + rng.IntN(8))
	}
	nvBytes := float64(n*k)*9/16 + 4
	switch format {
	case "mxfp4":
		return &backend.HostWeight{Name: "mx", Rows: n, Cols: k, Format: backend.MXFP4, MX: mx}, float64(len(mx.Packed) + len(mx.Scales)), nvBytes
	case "nvfp4":
		q, err := mx.ToNVFP4()
		if err != nil {
			b.Fatal(err)
		}
		return &backend.HostWeight{Name: "nv", Rows: n, Cols: k, Format: backend.NVFP4, Q: q}, nvBytes, nvBytes
	case "fp8":
		q := &quant.FP8Block{Rows: n, Cols: k, BlockRows: 128, BlockCols: 128, Data: make([]byte, n*k), ScaleDType: quant.ScaleE8M0}
		repeatMiB(q.Data, func() byte { return byte(rng.Uint32()) & 0xf7 }) // no NaN codes (0x7f, 0xff)
		sr, sc := q.ScaleShape()
		q.Scales = make([]byte, sr*sc)
		for i := range q.Scales {
			q.Scales[i] = byte(120 + rng.IntN(8))
		}
		bytes := float64(n*k + 4*sr*sc) // codes + float32 scales
		return &backend.HostWeight{Name: "fp8", Rows: n, Cols: k, Format: backend.FP8Block, FP8: q}, bytes, bytes
	case "bf16":
		data := repeatMiB(make([]byte, 2*n*k), func() byte { return byte(rng.Uint32()) })
		for i := 1; i < len(data); i += 2 { // the high bytes: sign and exponents 2^-7 .. 2^0 (no NaN or infinity)
			data[i] = data[i]&0x80 | byte(0x3c+rng.IntN(4)&3)
		}
		return &backend.HostWeight{Name: "bf16", Rows: n, Cols: k, Format: backend.BF16, Data: data}, float64(2 * n * k), float64(2 * n * k)
	}
	b.Fatalf("format %q", format)
	return nil, 0, 0
}
