package cpu

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// The working sets below are 1 GiB or more, far past any cache, so both
// figures are main-memory rates.
const benchBytes = 1 << 30

// copyBandwidth measures this machine's memory copy bandwidth (bytes read +
// bytes written per second) with every core copying its share of a 1 GiB
// buffer into another, the best of five runs.
var copyBandwidth = sync.OnceValue(func() float64 {
	src, dst := make([]byte, benchBytes), make([]byte, benchBytes)
	for i := range src {
		src[i] = byte(i)
	}
	b := New(0)
	best := 0.0
	for range 5 {
		start := time.Now()
		b.parallel(benchBytes, 1<<20, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
		best = max(best, 2*benchBytes/time.Since(start).Seconds())
	}
	return best
})

func BenchmarkCopy(b *testing.B) {
	b.ReportMetric(copyBandwidth()/1e9, "GB/s")
}

// benchFormats are the weight formats and kernels the benchmarks compare:
// nvfp4 is the int8-activation kernel (AVX-512 VNNI or SDOT where the
// processor has it), nvfp4-avx2 (amd64) or nvfp4-neon (arm64) the same with
// the base kernels forced (q8ForceBase), nvfp4-ref the float32 reference;
// bf16-avx2 the bf16 kernels without AVX-512 (forceAVX2; elsewhere the
// same as bf16).
var benchFormats = []struct {
	name   string
	format backend.Format
	opt    Options
	base   bool // q8ForceBase and forceAVX2
}{
	{"f32", backend.F32, Options{}, false},
	{"bf16", backend.BF16, Options{}, false},
	{"bf16-" + q8BaseName, backend.BF16, Options{}, true},
	{"nvfp4", backend.NVFP4, Options{}, false},
	{"nvfp4-" + q8BaseName, backend.NVFP4, Options{}, true},
	{"nvfp4-ref", backend.NVFP4, Options{ReferenceNVFP4: true}, false},
}

// BenchmarkMatVec times decode-step matvecs (m = 1) of 4096x4096 weights,
// cycling through enough distinct matrices to fill 1 GiB so that every call
// streams its weights from main memory, and reports the weight bytes read per
// second and that rate as a fraction of the copy bandwidth (bytes read +
// written) measured in the same run.
func BenchmarkMatVec(b *testing.B) {
	const N, K = 4096, 4096
	rng := rand.New(rand.NewPCG(1, 1))
	x := randn(rng, K)
	for _, c := range benchFormats {
		format := c.format
		b.Run(c.name, func(b *testing.B) {
			q8ForceBase, forceAVX2 = c.base, c.base
			defer func() { q8ForceBase, forceAVX2 = false, false }()
			be := NewWithOptions(c.opt)
			bytes := float64(N*K) * format.BytesPerValue()
			var ws []backend.Weight
			for range int(benchBytes / bytes) {
				h := benchWeight(rng, format, N, K)
				w, err := be.Upload(h)
				if err != nil {
					b.Fatal(err)
				}
				ws = append(ws, w)
			}
			out := be.NewBuffer(N)
			b.SetBytes(int64(bytes))
			b.ResetTimer()
			i := 0
			for b.Loop() {
				be.MatMul(out, Buffer(x), ws[i%len(ws)], 1)
				i++
			}
			bw := bytes * float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(bw/copyBandwidth(), "of-copy-bw")
		})
	}
}

// benchWeight is a random N x K host weight in format.
func benchWeight(rng *rand.Rand, format backend.Format, N, K int) *backend.HostWeight {
	h := &backend.HostWeight{Name: format.String(), Rows: N, Cols: K, Format: format}
	switch format {
	case backend.F32:
		h.Data = f32Bytes(randn(rng, N*K))
	case backend.BF16:
		h.Data, _ = bf16Bytes(randn(rng, N*K))
	case backend.NVFP4:
		h.Q = &quant.NVFP4{Rows: N, Cols: K, Packed: make([]byte, N*K/2), Scales: make([]byte, N*K/16), GlobalScale: 1e-3}
		for i := range h.Q.Packed {
			h.Q.Packed[i] = byte(rng.Uint32())
		}
		for i := range h.Q.Scales {
			h.Q.Scales[i] = quant.Float32ToE4M3(float32(0.5 + rng.Float64()))
		}
	}
	return h
}

// BenchmarkMatMulPrefill times prompt-sized matmuls: m = 64 tokens through
// an FFN up projection's shape of issue 61's model (8192 x 2048), and
// reports GFLOP/s (2 per weight per token) and GFLOP per CPU-second.
func BenchmarkMatMulPrefill(b *testing.B) {
	const N, K, m = 8192, 2048, 64
	rng := rand.New(rand.NewPCG(1, 3))
	x := randn(rng, m*K)
	for _, c := range benchFormats {
		b.Run(c.name, func(b *testing.B) {
			q8ForceBase, forceAVX2 = c.base, c.base
			defer func() { q8ForceBase, forceAVX2 = false, false }()
			be := NewWithOptions(c.opt)
			w, err := be.Upload(benchWeight(rng, c.format, N, K))
			if err != nil {
				b.Fatal(err)
			}
			out := be.NewBuffer(m * N)
			c0 := processCPU()
			for b.Loop() {
				be.MatMul(out, Buffer(x), w, m)
			}
			flop := 2 * N * K * m * float64(b.N) / 1e9
			b.ReportMetric(flop/b.Elapsed().Seconds(), "GFLOP/s")
			if c := processCPU() - c0; c > 0 {
				b.ReportMetric(flop/c, "GFLOP/cpu-s")
			}
		})
	}
}
