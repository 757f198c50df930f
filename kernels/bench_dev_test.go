//go:build manifold_dev

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/manifoldlm/manifold/backend"
)

// resetGEMVDev puts back the dev build's switches that BenchmarkGEMV's
// variants set.
func resetGEMVDev(g *Backend) {
	e := &g.exp
	e.dec, e.st4, e.x8, e.smallM, e.noLB, e.flags = defaultGemvDec, false, false, false, false, 0
	e.tmaWarps, e.tmaOcc, e.tmaUneven, e.noEvict, e.tmaAblate, e.pace, e.paceAll = 8, tmaOcc, false, false, 0, defaultTMAPace, false
}

// gemvDevVariants are BenchmarkGEMV's variants of the dev build, for an N x
// K shape (nv its NVFP4 weight, bfw its bf16 one): nvfp4-dec0 the m = 1
// kernel with integer E2M1 decoding, nvfp4-m16 the decode-shape kernel at m
// = 16, -contig with each warp on a contiguous run of K, -st4 with 4
// pipeline stages and fewer warps, -x8 the m <= 8 kernel (x read per chunk,
// nothing staged), -88reg the m = 1 kernel without the 64-register cap
// (fewer warps per SM), -16w gemv_nvfp4_tma (16 consumer warps, a block a
// multiprocessor), -x3 three blocks of 8 a multiprocessor, -uneven their
// tile counts uneven, -noevict the weight copies at normal L2 priority,
// -nopace with every block's ring filled at once (as before round 40;
// -pace2 two stages in flight as it fills, -paceall paced in small launches
// too), -nox and -nodec gemv_nvfp4_tma8 with x not staged or the weights not
// decoded (ablations, which its tracing instances take: what each costs,
// with the default's copies; -rows-nodec with row copies). The ablations
// and the kernels the default never takes need the dev image.
func gemvDevVariants(g *Backend, N int, nv, bfw *backend.HostWeight) []gemvVariant {
	pdl := func() { g.SetPDL(true) }
	if N == 128256 {
		return nil
	}
	if N == 16384 {
		return []gemvVariant{{"nvfp4-16w", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 16, 1 }},
			{"nvfp4-x2", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 8, 2 }},
			{"nvfp4-x3-tpb1", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc, g.force.tmaTPB = 8, 3, 1 }}}
	}
	return []gemvVariant{{"nvfp4-dec0", nv, []int{1}, func() { g.exp.dec = 0 }},
		{"nvfp4-m16", nv, []int{16}, func() { g.exp.smallM = true }},
		{"nvfp4-contig", nv, []int{1}, func() { g.exp.flags = 1 }},
		{"nvfp4-st4", nv, []int{1}, func() { g.exp.st4 = true }},
		{"nvfp4-16w", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 16, 1 }},
		{"nvfp4-16w-pdl", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 16, 1; pdl() }},
		{"nvfp4-uneven", nv, []int{1}, func() { g.exp.tmaUneven = true }},
		{"nvfp4-noevict", nv, []int{1}, func() { g.exp.noEvict = true }},
		{"nvfp4-noevict-pdl", nv, []int{1}, func() { g.exp.noEvict = true; pdl() }},
		{"nvfp4-uneven-pdl", nv, []int{1}, func() { g.exp.tmaUneven = true; pdl() }},
		{"nvfp4-nopace", nv, []int{1}, func() { g.exp.pace = 0 }},
		{"nvfp4-nopace-pdl", nv, []int{1}, func() { g.exp.pace = 0; pdl() }},
		{"nvfp4-pace2-pdl", nv, []int{1}, func() { g.exp.pace = 2; pdl() }},
		{"nvfp4-paceall-pdl", nv, []int{1}, func() { g.exp.paceAll = true; pdl() }},
		{"nvfp4-nox", nv, []int{1}, func() { g.exp.tmaAblate = 0x10 }},
		{"nvfp4-nox-pdl", nv, []int{1}, func() { g.exp.tmaAblate = 0x10; pdl() }},
		{"nvfp4-nodec", nv, []int{1}, func() { g.exp.tmaAblate = 0x20 }},
		{"nvfp4-nodec-pdl", nv, []int{1}, func() { g.exp.tmaAblate = 0x20; pdl() }},
		{"nvfp4-nox-nodec", nv, []int{1}, func() { g.exp.tmaAblate = 0x30 }},
		{"nvfp4-nox-nodec-pdl", nv, []int{1}, func() { g.exp.tmaAblate = 0x30; pdl() }},
		{"nvfp4-rows-nodec-pdl", nv, []int{1}, func() { g.force.tmaRows, g.exp.tmaAblate = true, 0x20; pdl() }},
		{"nvfp4-x3", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 8, 3 }},
		{"nvfp4-x3-pdl", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc = 8, 3; pdl() }},
		{"nvfp4-x3-tpb1", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc, g.force.tmaTPB = 8, 3, 1 }},
		{"nvfp4-x3-tpb1-pdl", nv, []int{1}, func() { g.exp.tmaWarps, g.exp.tmaOcc, g.force.tmaTPB = 8, 3, 1; pdl() }},
		{"nvfp4-88reg", nv, []int{1}, func() { g.exp.noLB = true }},
		{"nvfp4-x8", nv, []int{1}, func() { g.exp.x8 = true }},
		{"nvfp4-x8-contig", nv, []int{1}, func() { g.exp.x8, g.exp.flags = true, 1 }}}
}

// BenchmarkGEMVTimeline records when each block of gemv_nvfp4_tma8 (with
// tensor copies where the launch takes them: gemv_nvfp4_tma8_tm) reaches
// fixed points (global timer; flags bit 6) over a chain of launches with
// programmatic dependent launch, as in a decode step, and prints the last
// two launches on one time base: blocks' entry, the wait for the previous
// kernel, x staged, each stage's copies issued and arrived, the end. It
// shows where a launch's time goes between the copies and the consumers.
func BenchmarkGEMVTimeline(b *testing.B) {
	g := devBenchGPU(b, "gemv_nvfp4_tma8_trace", true)
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
			g.exp.tmaTrace, g.exp.tmaAblate = tb.(*Buffer).ptr, 0x40
			defer func() { g.exp.tmaTrace, g.exp.tmaAblate = 0, 0 }()
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
