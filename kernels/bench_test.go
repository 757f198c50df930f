package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
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
// nvfp4-m16 the decode-shape kernel at m = 16; nvfp4-dec0 the m = 1 kernel
// with integer E2M1 decoding, nvfp4-pipe
// the m = 1 kernel streaming x with the weights, -contig with each warp on a
// contiguous run of K, -st4 with 4 pipeline stages and fewer warps, -x8 the
// m <= 8 kernel (x read per chunk, nothing staged), -88reg the m = 1 kernel
// without the 64-register cap (fewer warps per SM), -1tile with one tile
// (16 features) per block, x staged by every block, -pdl with programmatic
// dependent launch (each call overlapping the previous one's tail), -nopace
// with every block's ring filled at once (as before round 40; -pace2 two
// stages in flight as it fills, -paceall paced in small launches too), -nox and
// -nodec gemv_nvfp4_tma8 with x not staged or the weights not decoded
// (ablations, which its tracing instances take: what each costs, with the
// default's copies; -rows-nodec with row copies), -rows gemv_nvfp4_tma8 with a
// copy per weight row, -tm with tensor copies at every size (gemv_nvfp4_tma8_tm;
// the default takes them from tmaMapsMin elements); bf16 picks its kernel
// by shape (one load in flight per lane, four on tall matrices), bf16-1load
// and bf16-4loads force one. 128256x4096 is the 8B model's LM head.
func BenchmarkGEMV(b *testing.B) {
	g := newGPU(b)
	g.SetGraphs(GraphsOff) // every launch timed as launched
	g.SetPDL(false)        // no overlap between consecutive launches
	copyBW := g.CopyBandwidth()
	b.Logf("device copy bandwidth (read+write): %.0f GB/s", copyBW/1e9)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", copyBW/1e9)
	rng := rand.New(rand.NewPCG(1, 1))
	type variant struct {
		name string
		h    *backend.HostWeight
		ms   []int
		set  func()
	}
	reset := func() {
		g.gemvDec, g.bf16Kernel, g.gemvOff, g.gemvPipe, g.gemvFlags, g.gemvSt4, g.gemvX8, g.gemvSmallM = defaultGemvDec, "", false, false, 0, false, false, false
		g.gemvLB, g.gemvMT, g.gemvTMA, g.gemmK128, g.gemmK256 = true, true, true, false, false
		g.tmaWarps, g.tmaSlots, g.tmaOcc, g.tmaTPB, g.tmaUneven, g.tmaEvict, g.tmaAblate, g.tmaPace, g.tmaPaceAll = 8, 0, 2, 0, false, true, 0, defaultTMAPace, false
		g.tmaMaps, g.tmaMapsAll = true, false
		g.SetPDL(false)
	}
	for _, shape := range [][2]int{{4096, 14336}, {14336, 4096}, {6144, 4096}, {128256, 4096}, {16384, 14336}} {
		N, K := shape[0], shape[1]
		bf := make([]byte, 2*N*K)
		for i := range bf[:1<<20] {
			bf[i] = byte(rng.Uint32() & 0x3f) // small finite bf16 values
		}
		for i := 1 << 20; i < len(bf); i += copy(bf[i:], bf[:1<<20]) {
		}
		bfw := &backend.HostWeight{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf}
		var vs []variant
		if N == 16384 { // 132 MB of NVFP4: the kernels' rate with launch and ramp amortized
			q := randomNVFP4(rng, N, K)
			nv := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q}
			vs = []variant{{"nvfp4", nv, []int{1}, reset}, {"nvfp4-16w", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 16, 1 }},
				{"nvfp4-x2", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 8, 2 }},
				{"nvfp4-x3-tpb1", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 3, 1 }},
				{"nvfp4-s1", nv, []int{1}, func() { g.gemvTMA = false }}}
		} else if N == 128256 {
			vs = []variant{{"bf16", bfw, []int{1}, reset}, {"bf16-1load", bfw, []int{1}, func() { g.bf16Kernel = "gemv_bf16" }}}
		} else {
			q := randomNVFP4(rng, N, K)
			nv := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: q}
			vs = []variant{{"nvfp4", nv, []int{1, 4, 16, 32, 64, 512}, reset}, {"nvfp4-dec0", nv, []int{1}, func() { g.gemvDec = 0 }},
				{"nvfp4-m16", nv, []int{16}, func() { g.gemvSmallM = true }},
				{"nvfp4-gemm", nv, []int{1}, func() { g.gemvOff = true }},
				{"nvfp4-k128", nv, []int{16, 64, 512}, func() { g.gemmK128 = true }},
				{"nvfp4-k256", nv, []int{4, 16, 32, 64}, func() { g.gemmK256 = true }},
				{"nvfp4-pipe", nv, []int{1}, func() { g.gemvPipe = true }},
				{"nvfp4-contig", nv, []int{1}, func() { g.gemvFlags = 1 }},
				{"nvfp4-st4", nv, []int{1}, func() { g.gemvSt4 = true }},
				{"nvfp4-pdl", nv, []int{1}, func() { g.SetPDL(true) }},
				{"nvfp4-16w", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 16, 1 }},
				{"nvfp4-16w-pdl", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 16, 1; g.SetPDL(true) }},
				{"nvfp4-uneven", nv, []int{1}, func() { g.tmaUneven = true }},
				{"nvfp4-tm", nv, []int{1}, func() { g.tmaMapsAll = true }},
				{"nvfp4-tm-pdl", nv, []int{1}, func() { g.tmaMapsAll = true; g.SetPDL(true) }},
				{"nvfp4-rows", nv, []int{1}, func() { g.tmaMaps = false }},
				{"nvfp4-rows-pdl", nv, []int{1}, func() { g.tmaMaps = false; g.SetPDL(true) }},
				{"nvfp4-noevict", nv, []int{1}, func() { g.tmaEvict = false }},
				{"nvfp4-noevict-pdl", nv, []int{1}, func() { g.tmaEvict = false; g.SetPDL(true) }},
				{"nvfp4-uneven-pdl", nv, []int{1}, func() { g.tmaUneven = true; g.SetPDL(true) }},
				{"nvfp4-nopace", nv, []int{1}, func() { g.tmaPace = 0 }},
				{"nvfp4-nopace-pdl", nv, []int{1}, func() { g.tmaPace = 0; g.SetPDL(true) }},
				{"nvfp4-pace2-pdl", nv, []int{1}, func() { g.tmaPace = 2; g.SetPDL(true) }},
				{"nvfp4-paceall-pdl", nv, []int{1}, func() { g.tmaPaceAll = true; g.SetPDL(true) }},
				{"nvfp4-nox", nv, []int{1}, func() { g.tmaAblate = 0x10 }},
				{"nvfp4-nox-pdl", nv, []int{1}, func() { g.tmaAblate = 0x10; g.SetPDL(true) }},
				{"nvfp4-nodec", nv, []int{1}, func() { g.tmaAblate = 0x20 }},
				{"nvfp4-nodec-pdl", nv, []int{1}, func() { g.tmaAblate = 0x20; g.SetPDL(true) }},
				{"nvfp4-nox-nodec", nv, []int{1}, func() { g.tmaAblate = 0x30 }},
				{"nvfp4-nox-nodec-pdl", nv, []int{1}, func() { g.tmaAblate = 0x30; g.SetPDL(true) }},
				{"nvfp4-rows-nodec-pdl", nv, []int{1}, func() { g.tmaMaps, g.tmaAblate = false, 0x20; g.SetPDL(true) }},
				{"nvfp4-x3", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 8, 3 }},
				{"nvfp4-x3-pdl", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc = 8, 3; g.SetPDL(true) }},
				{"nvfp4-x2-tpb1", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 2, 1 }},
				{"nvfp4-x2-tpb1-pdl", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 2, 1; g.SetPDL(true) }},
				{"nvfp4-x2-tpb2", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 2, 2 }},
				{"nvfp4-x3-tpb1", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 3, 1 }},
				{"nvfp4-x3-tpb1-pdl", nv, []int{1}, func() { g.tmaWarps, g.tmaOcc, g.tmaTPB = 8, 3, 1; g.SetPDL(true) }},
				{"nvfp4-s1", nv, []int{1}, func() { g.gemvTMA = false }},
				{"nvfp4-s1-pdl", nv, []int{1}, func() { g.gemvTMA = false; g.SetPDL(true) }},
				{"nvfp4-88reg", nv, []int{1}, func() { g.gemvLB = false }},
				{"nvfp4-1tile", nv, []int{1}, func() { g.gemvMT = false }},
				{"nvfp4-1tile-pdl", nv, []int{1}, func() { g.gemvMT = false; g.SetPDL(true) }},
				{"nvfp4-x8", nv, []int{1}, func() { g.gemvX8 = true }},
				{"nvfp4-x8-contig", nv, []int{1}, func() { g.gemvX8, g.gemvFlags = true, 1 }},
				{"bf16", bfw, []int{1, 16, 64}, reset}, {"bf16-4loads", bfw, []int{1}, func() { g.bf16Kernel = "gemv_bf16_u4" }}}
		}
		for _, v := range vs {
			h := v.h
			// Copies of the weights, taken in turn, so that no launch finds
			// its weights in L2 (50 MB on an H100) as a decode step never does;
			// uploaded by the variant's first benchmark the filter runs.
			bytes := float64(N*K) * h.Format.BytesPerValue()
			var ws []backend.Weight
			upload := func(b *testing.B) {
				for len(ws) < max(1, int(math.Ceil(200e6/bytes))) {
					w, err := g.Upload(h)
					if err != nil {
						b.Fatal(err)
					}
					ws = append(ws, w)
				}
			}
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
					x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
					g.Write(x, 0, randn(rng, m*K))
					for _, w := range ws { // every copy once: first-use work (tensor maps) stays out of the timing
						g.MatMul(y, x, w, m)
					}
					i := 0
					d := deviceTime(g, 50, func() { i++; g.MatMul(y, x, ws[i%len(ws)], m) })
					hs := time.Now() // the host's cost of queueing and launching one
					for range 50 {
						i++
						g.MatMul(y, x, ws[i%len(ws)], m)
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

// BenchmarkGEMVTimeline records when each block of gemv_nvfp4_tma8 (with
// tensor copies where the launch takes them: gemv_nvfp4_tma8_tm) reaches
// fixed points (global timer; flags bit 6) over a chain of launches with
// programmatic dependent launch, as in a decode step, and prints the last
// two launches on one time base: blocks' entry, the wait for the previous
// kernel, x staged, each stage's copies issued and arrived, the end. It
// shows where a launch's time goes between the copies and the consumers.
func BenchmarkGEMVTimeline(b *testing.B) {
	g := newGPU(b)
	g.SetGraphs(GraphsOff)
	g.SetPDL(true)
	rng := rand.New(rand.NewPCG(1, 1))
	for _, shape := range [][2]int{{4096, 14336}, {14336, 4096}, {6144, 4096}} {
		N, K := shape[0], shape[1]
		h := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: randomNVFP4(rng, N, K)}
		ws := make([]backend.Weight, max(1, int(math.Ceil(200e6/(float64(N*K)*h.Format.BytesPerValue())))))
		for i := range ws {
			w, err := g.Upload(h)
			if err != nil {
				b.Fatal(err)
			}
			ws[i] = w
		}
		b.Run(fmt.Sprintf("%dx%d", N, K), func(b *testing.B) {
			const words = 256 + 4*1024*64 // counters, then four launches of up to 1024 blocks
			tb := g.NewBuffer(2 * words)
			g.Write(tb, 0, make([]float32, 2*words))
			g.tmaTrace, g.tmaAblate = tb.(*Buffer).ptr, 0x40
			defer func() { g.tmaTrace, g.tmaAblate = 0, 0 }()
			x, y := g.NewBuffer(K), g.NewBuffer(N)
			g.Write(x, 0, randn(rng, K))
			for i := range 40 {
				g.MatMul(y, x, ws[i%len(ws)], 1)
			}
			raw := make([]float32, 2*words)
			g.Read(raw, tb, 0)
			if err := g.Sync(); err != nil {
				b.Fatal(err)
			}
			word := func(i int) uint64 {
				return uint64(math.Float32bits(raw[2*i])) | uint64(math.Float32bits(raw[2*i+1]))<<32
			}
			cnt := func(blk int) uint32 {
				w := word(blk / 2)
				return uint32(w >> (32 * (blk % 2)))
			}
			grid := 0
			for grid < 512 && cnt(grid) > 0 {
				grid++
			}
			if grid == 0 {
				b.Skip("no timeline written (not the bulk-copy kernel at this shape)")
			}
			last := int(cnt(0)) - 1
			at := func(launch, blk, slot int) uint64 { return word(256 + ((launch&3)*grid+blk)*64 + slot) }
			t0 := uint64(math.MaxUint64)
			for blk := range grid {
				t0 = min(t0, at(last-1, blk, 0))
			}
			us := func(t uint64) float64 { return float64(int64(t-t0)) / 1e3 }
			stat := func(launch, slot int) (lo, med, hi float64, ok bool) {
				var v []float64
				for blk := range grid {
					if t := at(launch, blk, slot); t != 0 {
						v = append(v, us(t))
					}
				}
				if len(v) == 0 {
					return 0, 0, 0, false
				}
				sort.Float64s(v)
				return v[0], v[len(v)/2], v[len(v)-1], true
			}
			for _, l := range []int{last - 1, last} {
				line := fmt.Sprintf("RESULT gemv_timeline N=%d K=%d blocks=%d launch=%d", N, K, grid, l-last)
				for _, p := range []struct {
					name string
					slot int
				}{{"entry", 0}, {"waited", 30}, {"staged", 31}, {"end", 60}} {
					if lo, med, hi, ok := stat(l, p.slot); ok {
						line += fmt.Sprintf(" %s=%.2f/%.2f/%.2f", p.name, lo, med, hi)
					}
				}
				fmt.Println(line)
				for s := range 24 {
					_, ib, ih, ok1 := stat(l, 1+s)
					_, fb, fh, ok2 := stat(l, 32+s)
					if !ok1 && !ok2 {
						break
					}
					fmt.Printf("RESULT gemv_timeline_stage launch=%d stage=%d issued_med=%.2f issued_max=%.2f arrived_med=%.2f arrived_max=%.2f\n",
						l-last, s, ib, ih, fb, fh)
				}
			}
		})
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
	g := newGPU(b)
	g.SetGraphs(GraphsOff)
	g.SetPDL(true)
	copyBW := g.CopyBandwidth()
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
			for i := range len(sets) { // first-use work (tensor maps) out of the timing
				block(i)
			}
			for i := 0; i < b.N; i++ {
				n := 0
				d := deviceTime(g, 50, func() { block(n); n++ })
				if err := g.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/block")
				b.ReportMetric(mb/d.Seconds()/copyBW, "of-copy-bw")
				fmt.Printf("RESULT ffn_chain %s time_us=%.2f weight_MB=%.1f of_copy=%.3f\n", v.name, float64(d.Nanoseconds())/1e3, mb/1e6, mb/d.Seconds()/copyBW)
			}
		})
	}
}
