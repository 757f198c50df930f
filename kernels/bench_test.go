package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

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
// as a fraction of the copy bandwidth measured in the same run. Variants:
// nvfp4 at m = 1 is gemv_nvfp4_tma (gemv.cuh), at m > 1 gemm_nvfp4_t*
// (gemm.cuh; m = 512 is a prefill chunk), nvfp4-k128 those in stages of 128
// elements, nvfp4-k256 in stages of 256 where 512 would be taken, nvfp4-gemm
// the GEMM at m = 1;
// nvfp4-s1 the m = 1 kernel before it (x staged per block, cp.async);
// nvfp4-pipe the m = 1 kernel streaming x with the weights, -1tile with one
// tile (16 features) per block, x staged by every block, -pdl with
// programmatic dependent launch (each call overlapping the previous one's
// tail), -rows gemv_nvfp4_tma8 with a copy per weight row, -tm with tensor
// copies at every size (gemv_nvfp4_tma8_tm; the default takes them from
// tmaMapsMin elements), -x2-tpb1 and -x2-tpb2 with one or two tiles a block
// instead of the persistent grid; bf16 picks its kernel by shape (one load
// in flight per lane, four on tall matrices), bf16-1load and bf16-4loads
// force one. 128256x4096 is the 8B model's LM head; the shapes with K %
// 2048 != 0 take the m = 1 variants nvfp4, -rows, -tm and -s1 only. The dev
// build adds its experiments (bench_dev_test.go: gemvDevVariants).
func BenchmarkGEMV(b *testing.B) {
	g, copyBW := benchGPU(b, false)
	b.Logf("device copy bandwidth (read+write): %.0f GB/s", copyBW/1e9)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", copyBW/1e9)
	rng := rand.New(rand.NewPCG(1, 1))
	type variant = gemvVariant
	reset := func() {
		f := &g.force
		f.bf16Kernel, f.gemvOff, f.gemvPipe, f.gemvOneTile, f.noGemvTMA, f.gemmK128, f.gemmK256 = "", false, false, false, false, false, false
		f.tmaSlots, f.tmaTPB, f.tmaRows, f.tmaMapsAll = 0, 0, false, false
		resetGEMVDev(g)
		g.SetPDL(false)
	}
	// The last six: Qwen3-4B's, Qwen3-14B's, Llama-3.2-3B's and
	// Qwen2.5-1.5B's FFN widths, K % 2048 != 0 (a partial last stage).
	for _, shape := range [][2]int{{4096, 14336}, {14336, 4096}, {6144, 4096}, {128256, 4096}, {16384, 14336},
		{9728, 2560}, {2560, 9728}, {17408, 5120}, {5120, 17408}, {8192, 3072}, {8960, 1536}} {
		N, K := shape[0], shape[1]
		bf := repeatMiB(make([]byte, 2*N*K), func() byte { return byte(rng.Uint32() & 0x3f) }) // small finite bf16 values
		bfw := &backend.HostWeight{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf}
		var vs []variant
		if N == 16384 { // 132 MB of NVFP4: the kernels' rate with launch and ramp amortized
			q := randomNVFP4(rng, N, K)
			nv := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q}
			vs = []variant{{"nvfp4", nv, []int{1}, reset}, {"nvfp4-s1", nv, []int{1}, func() { g.force.noGemvTMA = true }}}
			vs = append(vs, gemvDevVariants(g, N, nv, bfw)...)
		} else if K%2048 != 0 { // the m = 1 kernels only
			q := randomNVFP4(rng, N, K)
			nv := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q}
			vs = []variant{{"nvfp4", nv, []int{1}, reset}, {"nvfp4-rows", nv, []int{1}, func() { g.force.tmaRows = true }},
				{"nvfp4-tm", nv, []int{1}, func() { g.force.tmaMapsAll = true }}, {"nvfp4-s1", nv, []int{1}, func() { g.force.noGemvTMA = true }}}
		} else if N == 128256 {
			vs = []variant{{"bf16", bfw, []int{1}, reset}, {"bf16-1load", bfw, []int{1}, func() { g.force.bf16Kernel = "gemv_bf16" }}}
		} else {
			q := randomNVFP4(rng, N, K)
			nv := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q}
			vs = []variant{{"nvfp4", nv, []int{1, 4, 16, 32, 64, 512}, reset},
				{"nvfp4-gemm", nv, []int{1}, func() { g.force.gemvOff = true }},
				{"nvfp4-k128", nv, []int{16, 64, 512}, func() { g.force.gemmK128 = true }},
				{"nvfp4-k256", nv, []int{4, 16, 32, 64}, func() { g.force.gemmK256 = true }},
				{"nvfp4-pipe", nv, []int{1}, func() { g.force.gemvPipe = true }},
				{"nvfp4-pdl", nv, []int{1}, func() { g.SetPDL(true) }},
				{"nvfp4-tm", nv, []int{1}, func() { g.force.tmaMapsAll = true }},
				{"nvfp4-tm-pdl", nv, []int{1}, func() { g.force.tmaMapsAll = true; g.SetPDL(true) }},
				{"nvfp4-rows", nv, []int{1}, func() { g.force.tmaRows = true }},
				{"nvfp4-rows-pdl", nv, []int{1}, func() { g.force.tmaRows = true; g.SetPDL(true) }},
				{"nvfp4-x2-tpb1", nv, []int{1}, func() { g.force.tmaTPB = 1 }},
				{"nvfp4-x2-tpb1-pdl", nv, []int{1}, func() { g.force.tmaTPB = 1; g.SetPDL(true) }},
				{"nvfp4-x2-tpb2", nv, []int{1}, func() { g.force.tmaTPB = 2 }},
				{"nvfp4-s1", nv, []int{1}, func() { g.force.noGemvTMA = true }},
				{"nvfp4-s1-pdl", nv, []int{1}, func() { g.force.noGemvTMA = true; g.SetPDL(true) }},
				{"nvfp4-1tile", nv, []int{1}, func() { g.force.gemvOneTile = true }},
				{"nvfp4-1tile-pdl", nv, []int{1}, func() { g.force.gemvOneTile = true; g.SetPDL(true) }},
				{"bf16", bfw, []int{1, 16, 64}, reset}, {"bf16-4loads", bfw, []int{1}, func() { g.force.bf16Kernel = "gemv_bf16_u4" }}}
			vs = append(vs, gemvDevVariants(g, N, nv, bfw)...)
		}
		for _, v := range vs {
			h := v.h
			// Copies of the weights, taken in turn, so that no launch finds
			// its weights in L2 (50 MB on an H100) as a decode step never does;
			// uploaded by the variant's first benchmark the filter runs.
			bytes := float64(N*K) * h.Format.BytesPerValue()
			var ws []backend.Weight
			upload := func(b *testing.B) { ws = weightCopies(b, g, h, ws, bytes) }
			v.set()
			for _, m := range v.ms {
				b.Run(fmt.Sprintf("%s/%dx%d/m=%d", v.name, N, K, m), func(b *testing.B) {
					// Buffers and weights of earlier variants are freed now, not by
					// a collection during the timing (a free waits for the device).
					runtime.GC()
					upload(b)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
					d, next := timeMatMul(g, ws, rng, m, N, K)
					hs := time.Now() // the host's cost of queueing and launching one
					for range 50 {
						next()
					}
					g.onContext(func() {})
					host := time.Since(hs) / 50
					b.ReportMetric(float64(d.Microseconds()), "us/op")
					b.ReportMetric(bytes/d.Seconds()/1e9, "weight-GB/s")
					b.ReportMetric(bytes/d.Seconds()/copyBW, "of-copy-bw")
					fmt.Printf("RESULT gemv %s N=%d K=%d m=%d time_us=%.2f weight_GBps=%.0f of_copy=%.3f host_us=%.2f\n", v.name, N, K, m,
						float64(d.Nanoseconds())/1e3, bytes/d.Seconds()/1e9, bytes/d.Seconds()/copyBW, float64(host.Nanoseconds())/1e3)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
			reset()
		}
	}
}

// BenchmarkFFNChain times a Llama-3-8B-shape feed-forward block at m = 1 as
// a decode step queues it (gate and up in one launch with the SwiGLU
// epilogue, then the down projection with the residual add in its
// epilogue), blocks chained with programmatic dependent launch, weights
// rotated through copies so that none is found in L2. It reports the
// block's weight bytes per second against the copy bandwidth: the two m = 1
// shapes of BenchmarkGEMV (14336 x 4096 twice in one launch, 4096 x 14336)
// as the step runs them, each launch after the other kind (ffn), and the
// gate and up launch alone, chained with itself (gateup).
func BenchmarkFFNChain(b *testing.B) {
	g, copyBW := benchGPU(b, true)
	rng := rand.New(rand.NewPCG(3, 3))
	const hidden, ffn = 4096, 14336
	type ffnWeights struct{ gate, up, down backend.Weight }
	upload := func(n, k int) backend.Weight {
		w, err := g.Upload(&backend.HostWeight{Name: "nvfp4", Rows: n, Cols: k, Format: backend.NVFP4, Q: randomNVFP4(rng, n, k)})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	sets := make([]ffnWeights, 3)
	for i := range sets {
		sets[i] = ffnWeights{upload(ffn, hidden), upload(ffn, hidden), upload(hidden, ffn)}
	}
	matBytes := float64(hidden*ffn) * backend.NVFP4.BytesPerValue() // one weight's E2M1 codes and scales
	x, gate, up, h, res := g.NewBuffer(hidden), g.NewBuffer(ffn), g.NewBuffer(ffn), g.NewBuffer(hidden), g.NewBuffer(hidden)
	g.Write(x, 0, randn(rng, hidden))
	g.Write(res, 0, make([]float32, hidden))
	for _, v := range []struct {
		name string
		down bool
	}{{"ffn", true}, {"gateup", false}} {
		mb := 2 * matBytes // bytes a block reads
		if v.down {
			mb = 3 * matBytes
		}
		block := func(i int) {
			s := sets[i%len(sets)]
			g.MatMul(gate, x, s.gate, 1)
			g.MatMul(up, x, s.up, 1)
			g.SwiGLU(gate, gate, up, 0)
			if v.down {
				g.MatMul(h, gate, s.down, 1)
				g.Add(res, res, h)
			}
		}
		b.Run(v.name, func(b *testing.B) {
			timeBlocks(b, g, len(sets), 50, block, mb, copyBW, "ffn_chain "+v.name)
		})
	}
}

// gemvVariant is one of BenchmarkGEMV's variants: a weight, the token
// counts it runs at, and what it sets on the backend first.
type gemvVariant struct {
	name string
	h    *backend.HostWeight
	ms   []int
	set  func()
}

// weightCopies appends uploads of h to ws until the copies take 200 MB
// (devBytes each on the device): taken in turn, no launch finds its weights
// in L2 (50 MB on an H100), as a decode step never does.
func weightCopies(b *testing.B, g *Backend, h *backend.HostWeight, ws []backend.Weight, devBytes float64) []backend.Weight {
	b.Helper()
	for len(ws) < max(1, int(math.Ceil(200e6/devBytes))) {
		w, err := g.Upload(h)
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, w)
	}
	return ws
}

// timeMatMul times y = x·wᵀ for m random rows x of K through the weights ws
// taken in turn: after every copy once (first-use work such as tensor maps
// stays out of the timing), the device time of one (deviceTime over 50).
// next queues the following one.
func timeMatMul(g *Backend, ws []backend.Weight, rng *rand.Rand, m, N, K int) (d time.Duration, next func()) {
	x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
	g.Write(x, 0, randn(rng, m*K))
	for _, w := range ws {
		g.MatMul(y, x, w, m)
	}
	i := 0
	next = func() { i++; g.MatMul(y, x, ws[i%len(ws)], m) }
	return deviceTime(g, 50, next), next
}

// repeatMiB fills p's first MiB with gen's bytes and repeats it over the
// rest: benchmark weights, quick to make, random enough.
func repeatMiB(p []byte, gen func() byte) []byte {
	for i := range p[:1<<20] {
		p[i] = gen()
	}
	for i := 1 << 20; i < len(p); i += copy(p[i:], p[:1<<20]) {
	}
	return p
}

// benchGPU is the GPU backend of a matmul benchmark, every launch timed as
// launched (no graphs), with or without PDL, and its copy bandwidth.
// timeBlocks runs block once on each of sets weight sets (first-use work,
// such as tensor maps, out of the timing), then times iters blocks chained
// over the sets in turn, b.N times: it reports the time a block and its
// bytes (of weights) a second against the copy bandwidth, and prints them
// as a RESULT line named result.
func timeBlocks(b *testing.B, g *Backend, sets, iters int, block func(i int), bytes, copyBW float64, result string) {
	for i := range sets {
		block(i)
	}
	for i := 0; i < b.N; i++ {
		n := 0
		d := deviceTime(g, iters, func() { block(n); n++ })
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
		us := float64(d.Nanoseconds()) / 1e3
		b.ReportMetric(us, "us/block")
		b.ReportMetric(bytes/d.Seconds()/copyBW, "of-copy-bw")
		fmt.Printf("RESULT %s time_us=%.2f weight_MB=%.1f of_copy=%.3f\n", result, us, bytes/1e6, bytes/d.Seconds()/copyBW)
	}
}

func benchGPU(b *testing.B, pdl bool) (*Backend, float64) {
	g := newGPU(b)
	g.SetGraphs(GraphsOff)
	g.SetPDL(pdl)
	// A timed loop multiplies the same x by one weight after another:
	// each GEMM converts it, as each did before GEMMs of one input in a
	// row shared the conversion, so that the recorded times compare.
	g.force.gemmXEvery = true
	return g, g.CopyBandwidth()
}

// BenchmarkGEMMTiles times every NVFP4 GEMM variant (gemmKernels) at the
// Llama-3-8B shapes of a batched decode step (q and o 4096x4096, k and v
// 1024x4096, gate and up 14336x4096, down 4096x14336) for m = 8..256
// sequences, beside gemmPick's choice (RESULT gemmtile ... picked=NAME):
// the data to choose gemmPick's variant at the batch sizes of issue 60's
// serving steps, which round 35 tuned at m = 16, 64 and 512 only. Each
// time includes the conversion of x (gemm_x_h8).
func BenchmarkGEMMTiles(b *testing.B) {
	g, copyBW := benchGPU(b, true)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", copyBW/1e9)
	rng := rand.New(rand.NewPCG(2, 2))
	for _, shape := range [][2]int{{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}} {
		N, K := shape[0], shape[1]
		h := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: randomNVFP4(rng, N, K)}
		bytes := float64(N*K) * h.Format.BytesPerValue()
		var ws []backend.Weight
		for _, m := range []int{8, 16, 32, 48, 64, 96, 128, 256} {
			picked := gemmPick(m, N, K, g.sms, false, false).name()
			for _, k := range append([]gemmKernel{{}}, gemmKernels...) {
				name := "picked"
				if k != (gemmKernel{}) {
					name = k.name()
				}
				b.Run(fmt.Sprintf("%dx%d/m=%d/%s", N, K, m, name), func(b *testing.B) {
					runtime.GC()
					ws = weightCopies(b, g, h, ws, bytes)
					g.force.gemmTile = ""
					if k != (gemmKernel{}) {
						g.force.gemmTile = name
					}
					defer func() { g.force.gemmTile = "" }()
					d, _ := timeMatMul(g, ws, rng, m, N, K)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
					flops := 2 * float64(m) * float64(N) * float64(K)
					fmt.Printf("RESULT gemmtile N=%d K=%d m=%d kernel=%s picked=%s time_us=%.2f tflops=%.1f weight_of_copy=%.3f\n",
						N, K, m, name, picked, float64(d.Nanoseconds())/1e3, flops/d.Seconds()/1e12, bytes/d.Seconds()/copyBW)
				})
			}
		}
	}
}
