package cpu

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// copyBandwidth measures this machine's memory copy bandwidth (bytes read +
// bytes written per second) with every core copying its share of a 256 MiB
// buffer, the best of five runs.
var copyBandwidth = sync.OnceValue(func() float64 {
	const n = 256 << 20
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	b := New(0)
	best := 0.0
	for range 5 {
		start := time.Now()
		b.parallel(n, 1<<20, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		best = max(best, 2*n/time.Since(start).Seconds())
	}
	return best
})

func BenchmarkCopy(b *testing.B) {
	b.ReportMetric(copyBandwidth()/1e9, "GB/s")
}

// BenchmarkMatVec times one decode-step matvec (m = 1) of a 4096x4096 weight
// and reports the weight bytes streamed per second and that bandwidth as a
// fraction of the copy bandwidth (bytes read + written) measured in the same run.
func BenchmarkMatVec(b *testing.B) {
	const N, K = 4096, 4096
	rng := rand.New(rand.NewPCG(1, 1))
	w := randn(rng, N*K)
	x := randn(rng, K)
	bf, _ := bf16Bytes(w)
	q, err := quant.QuantizeNVFP4(w, N, K)
	if err != nil {
		b.Fatal(err)
	}
	for _, h := range []*backend.HostWeight{
		{Name: "f32", Rows: N, Cols: K, Format: backend.F32, Data: f32Bytes(w)},
		{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf},
		{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q},
	} {
		b.Run(h.Name, func(b *testing.B) {
			be := New(0)
			wt, err := be.Upload(h)
			if err != nil {
				b.Fatal(err)
			}
			out := be.NewBuffer(N)
			bytes := float64(N*K) * h.Format.BytesPerValue()
			b.SetBytes(int64(bytes))
			b.ResetTimer()
			for b.Loop() {
				be.MatMul(out, Buffer(x), wt, 1)
			}
			bw := bytes * float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(bw/copyBandwidth(), "of-copy-bw")
		})
	}
}
