package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

// TestDecodeStepFusedAndGraphed runs a decode step shaped like a Llama block
// (fused q/k/v matmuls, RoPE of q and k, attention with the cache append,
// output projection with the residual add, gate/up with SwiGLU, down with the
// residual add) on the GPU and the CPU, step after step, so that the GPU
// replays it as a graph from the third step on; with graphs and without,
// and with GraphsAuto, each step queued while the one before runs (as
// engine's Generate does), so that it too replays them. (The dev build adds
// the integer E2M1 decoding with the RMSNorms fused into the staged
// kernels: decode_dev_test.go.)
// Weights scale as 1/√fan-in, as in a trained model, so that activations
// stay near unit size. Tolerance: five
// NVFP4 matmuls in series each round their input to fp16 (relative 2^-12 on
// average per element), and RMSNorm and attention pass relative errors on
// unamplified: 5e-3 over the residual stream and logits.
func TestDecodeStepFusedAndGraphed(t *testing.T) {
	for _, graphs := range []GraphMode{GraphsOn, GraphsOff, GraphsAuto} {
		t.Run(fmt.Sprintf("dec1/graphs=%v", graphs), func(t *testing.T) { testDecodeStep(t, 1, graphs, 0, nil) })
	}
	// Several tiles per block (gemv_nvfp4_s1_d1_mt), a count that divides
	// none of the launches' tile counts.
	t.Run("dec1/graphs=on/tiles=3", func(t *testing.T) { testDecodeStep(t, 1, GraphsOn, 3, nil) })
	// Widths that gemv_nvfp4_tma8 takes (K % 2048 == 0), its RMSNorms fused in.
	// Row copies, and tensor copies at every size (their SwiGLU and residual epilogues).
	for _, graphs := range []GraphMode{GraphsOn, GraphsOff, GraphsAuto} {
		t.Run(fmt.Sprintf("tma/graphs=%v", graphs), func(t *testing.T) { testDecodeStep(t, 1, graphs, -1, nil) })
		t.Run(fmt.Sprintf("tma-maps/graphs=%v", graphs), func(t *testing.T) { testDecodeStep(t, 1, graphs, -3, nil) })
	}
	t.Run("tma/attention_kv", func(t *testing.T) { testDecodeStep(t, 1, GraphsOn, -2, nil) })
	// Widths whose tiles end in a partial stage (K % 2048 != 0): q, k, v and
	// gate/up (RMSNorm fused, SwiGLU) at K = 2560, the down projection
	// (residual add) at K = 1536, that stage only.
	for _, graphs := range []GraphMode{GraphsOn, GraphsOff} {
		t.Run(fmt.Sprintf("tma-tail/graphs=%v", graphs), func(t *testing.T) { testDecodeStep(t, 1, graphs, -4, nil) })
		t.Run(fmt.Sprintf("tma-tail-maps/graphs=%v", graphs), func(t *testing.T) { testDecodeStep(t, 1, graphs, -5, nil) })
	}
}

// testDecodeStep: tiles > 0 forces that many tiles per block (and, as
// tiles 0, the staged kernels); -1 selects widths for gemv_nvfp4_tma8 (row
// copies), -3 the same with tensor copies at every size, -2 with
// attention_kv instead of attn_short and attn_decode, -4 and -5 as -1 and
// -3 with hidden 2560 and ffn 1536 (partial last stages). seed seeds the
// random values; set, when not nil, changes g before the steps (the dev
// build's variants).
func testDecodeStep(t *testing.T, seed uint64, graphs GraphMode, tiles int, set func(g *Backend)) {
	g, c := newGPU(t), refCPU()
	g.force.gemvTiles = max(tiles, 0)
	g.force.noGemvTMA = tiles >= 0
	g.force.tmaRows, g.force.tmaMapsAll = tiles == -1 || tiles == -4, tiles == -3 || tiles == -5
	g.force.attnKV = tiles == -2
	if set != nil {
		set(g)
	}
	g.SetGraphs(graphs)
	rng := rand.New(rand.NewPCG(21, seed))
	hidden, ffn, heads, kvHeads, hd, vocab := 512, 768, 8, 2, 64, 300
	if tiles < 0 {
		hidden, ffn, heads, kvHeads = 2048, 4096, 32, 4
	}
	if tiles <= -4 {
		hidden, ffn = 2560, 1536
	}
	s := layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 10000}, hd)
	if err != nil {
		t.Fatal(err)
	}
	upload := func(n, k int, f backend.Format) (backend.Weight, backend.Weight) {
		h := scaledWeight(rng, f, n, k)
		wc, wg := uploadBoth(t, g, c, h)
		return wc, wg
	}
	nv := backend.NVFP4
	type pair struct{ c, g backend.Weight }
	mk := func(n, k int, f backend.Format) pair { a, b := upload(n, k, f); return pair{a, b} }
	embed, wq, wk, wv, wo := mk(vocab, hidden, backend.BF16), mk(heads*hd, hidden, nv), mk(kvHeads*hd, hidden, nv), mk(kvHeads*hd, hidden, nv), mk(hidden, heads*hd, nv)
	wgate, wup, wdown, head := mk(ffn, hidden, nv), mk(ffn, hidden, nv), mk(hidden, ffn, nv), mk(vocab, hidden, backend.BF16)
	norm := randn(rng, hidden)
	cc, _ := c.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: 64})
	gc, err := g.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: 64})
	if err != nil {
		t.Fatal(err)
	}
	// One set of buffers per backend, as a model's state.
	type bufs struct{ x, h, q, k, v, att, gate, up, logits, norm backend.Buffer }
	newBufs := func(b backend.Backend) bufs {
		nb := b.NewBuffer
		n := nb(hidden)
		b.Write(n, 0, norm)
		return bufs{nb(hidden), nb(hidden), nb(heads * hd), nb(kvHeads * hd), nb(kvHeads * hd), nb(heads * hd),
			nb(ffn), nb(ffn), nb(vocab), n}
	}
	bc, bg := newBufs(c), newBufs(g)
	step := func(b backend.Backend, u bufs, w func(pair) backend.Weight, cache backend.KVCache, tok int32, pos int) {
		b.Embed(u.x, w(embed), []int32{tok})
		b.RMSNorm(u.h, u.x, u.norm, 1e-5)
		b.MatMul(u.q, u.h, w(wq), 1)
		b.MatMul(u.k, u.h, w(wk), 1)
		b.MatMul(u.v, u.h, w(wv), 1)
		b.RoPE(u.q, 1, heads, hd, 0, pos, rope, false)
		b.RoPE(u.k, 1, kvHeads, hd, 0, pos, rope, false)
		b.Attention(u.att, u.q, u.k, u.v, cache, 0, pos, 1, s)
		b.MatMul(u.h, u.att, w(wo), 1)
		b.Add(u.x, u.x, u.h)
		b.RMSNorm(u.h, u.x, u.norm, 1e-5)
		b.MatMul(u.gate, u.h, w(wgate), 1)
		b.MatMul(u.up, u.h, w(wup), 1)
		b.SwiGLU(u.gate, u.gate, u.up, 0)
		b.MatMul(u.h, u.gate, w(wdown), 1)
		b.Add(u.x, u.x, u.h)
		b.RMSNorm(u.h, u.x, u.norm, 1e-5)
		b.MatMul(u.logits, u.h, w(head), 1)
	}
	before := g.GraphLaunches()
	const steps = 12
	toks := make([]int32, steps)
	for i := range toks {
		toks[i] = int32(rng.IntN(vocab))
	}
	onCPU := func(p pair) backend.Weight { return p.c }
	onGPU := func(p pair) backend.Weight { return p.g }
	check := func(pos int) {
		for _, cmp := range []struct {
			name   string
			gb, cb backend.Buffer
			tol    float64
		}{{"x", bg.x, bc.x, 5e-3}, {"up", bg.up, bc.up, 5e-3}, {"logits", bg.logits, bc.logits, 5e-3}} {
			if e := relErr(fromGPU(t, g, cmp.gb), cmp.cb.(cpu.Buffer)); e > cmp.tol {
				t.Errorf("position %d: %s: relative error %.3g", pos, cmp.name, e)
			}
		}
	}
	if graphs == GraphsAuto {
		// As engine's Generate: a pick launches each step without waiting
		// for it (SampleTokenTo) and the next step is queued while it runs,
		// so that the mode replays them as graphs. The last step's values
		// hold every earlier one's through the cache. At these sizes the
		// device outruns the host's launches, so each step ends with a
		// matmul over 128 MB of zeros that keeps it busy for tens of
		// microseconds after its pick is launched.
		pick := g.NewBuffer(1)
		rows := (64 << 20) / hidden
		busy, err := g.Upload(&backend.HostWeight{Name: "busy", Rows: rows, Cols: hidden, Format: backend.BF16, Data: make([]byte, 2*rows*hidden)})
		if err != nil {
			t.Fatal(err)
		}
		scratch := g.NewBuffer(rows)
		for pos, tok := range toks {
			step(g, bg, onGPU, gc, tok, pos)
			g.MatMul(scratch, bg.h, busy, 1)
			if pos < steps-1 {
				if _, err := g.SampleTokenTo(pick, bg.logits, 0, 0, 0); err != nil {
					t.Fatal(err)
				}
			}
		}
		for pos, tok := range toks {
			step(c, bc, onCPU, cc, tok, pos)
		}
		check(steps - 1)
	} else {
		for pos, tok := range toks {
			step(c, bc, onCPU, cc, tok, pos)
			step(g, bg, onGPU, gc, tok, pos)
			check(pos)
		}
	}
	if n := g.GraphLaunches() - before; graphs != GraphsOff && n == 0 {
		t.Errorf("no step was replayed as a graph")
	} else {
		t.Logf("%d of %d steps replayed as graphs", n, steps)
	}
}

// scaledWeight is hostWeight with values of standard deviation 1/√k and no bias.
func scaledWeight(rng *rand.Rand, f backend.Format, n, k int) *backend.HostWeight {
	h := hostWeight(rng, backend.F32, n, k)
	w := make([]float32, n*k)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(h.Data[4*i:])) / float32(math.Sqrt(float64(k)))
	}
	out := &backend.HostWeight{Name: "w", Rows: n, Cols: k, Format: f}
	switch f {
	case backend.BF16:
		out.Data = make([]byte, 2*len(w))
		for i, v := range w {
			binary.LittleEndian.PutUint16(out.Data[2*i:], quant.Float32ToBF16(v))
		}
	case backend.NVFP4:
		out.Q, _ = quant.QuantizeNVFP4(w, n, k)
	default:
		panic("scaledWeight: bf16 or nvfp4")
	}
	return out
}

// TestAttentionSplits covers flash-decoding: decode rows over a context long
// enough to split the keys over blocks, after a long prefill.
func TestAttentionSplits(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(9, 10))
	s := layers.AttentionShape{Heads: 4, KVHeads: 2, HeadDim: 32}
	compareAttention(t, g, c, rng, s, 1, 0, [][2]int{{0, 1040}, {1040, 1041}, {1041, 1044}, {1044, 1045}})
}

// TestNormFusedIntoMatMul: RMSNorm of one row then an NVFP4 matmul of it run
// as one kernel (gemv_nvfp4_tma8*, where K % 256 == 0), which also writes
// the normalized row; and apart where the matmul does not take it. Widths
// with a partial last stage, that stage only (512, 1536), and x staged in
// one pass (K <= 16384) or in a loop (17408).
func TestNormFusedIntoMatMul(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(13, 14))
	for _, sh := range [][2]int{{300, 512}, {40, 4096}, {300, 6144}, {33, 1536}, {129, 2560}, {70, 9728}, {20, 17408}} {
		normThenMatMul(t, g, c, rng, sh[0], sh[1])
	}
}

// normThenMatMul holds RMSNorm then a matmul of the normalized row, n x k,
// to the CPU.
func normThenMatMul(t *testing.T, g *Backend, c *cpu.Backend, rng *rand.Rand, n, k int) {
	t.Helper()
	h := scaledWeight(rng, backend.NVFP4, n, k)
	wc, wg := uploadBoth(t, g, c, h)
	x, nw := randn(rng, k), randn(rng, k)
	hc, yc := make(cpu.Buffer, k), make(cpu.Buffer, n)
	c.RMSNorm(hc, cpu.Buffer(x), cpu.Buffer(nw), 1e-6)
	c.MatMul(yc, hc, wc, 1)
	gx, gw := toGPU(g, x), toGPU(g, nw)
	hg, yg := g.NewBuffer(k), g.NewBuffer(n)
	g.RMSNorm(hg, gx, gw, 1e-6)
	g.MatMul(yg, hg, wg, 1)
	if e := relErr(fromGPU(t, g, hg), hc); e > 1e-6 {
		t.Errorf("%d x %d: normalized row: relative error %.3g", n, k, e)
	}
	if e := relErr(fromGPU(t, g, yg), yc); e > 1e-3 {
		t.Errorf("%d x %d: matmul: relative error %.3g", n, k, e)
	}
}

// TestGemvTilesPerBlock holds the m = 1 kernel with several tiles per block
// (x staged once for them; forced here, since these shapes are too small for
// the launch to choose it, and gemv_nvfp4_tma8 kept out, which would take
// them) to the CPU backend, tile counts that T does not divide included;
// tolerance as TestMatMul's for NVFP4.
func TestGemvTilesPerBlock(t *testing.T) {
	g, c := newGPU(t), refCPU()
	g.force.noGemvTMA = true
	rng := rand.New(rand.NewPCG(17, 18))
	for _, tiles := range []int{2, 3, 4, 8} {
		for _, sh := range []struct{ n, k int }{{300, 1024}, {513, 1024}, {24, 256}, {1000, 4096}, {64, 2048}} {
			g.force.gemvTiles = tiles
			h := hostWeight(rng, backend.NVFP4, sh.n, sh.k)
			wc, wg := uploadBoth(t, g, c, h)
			x := randn(rng, sh.k)
			want := make(cpu.Buffer, sh.n)
			c.MatMul(want, cpu.Buffer(x), wc, 1)
			out := g.NewBuffer(sh.n)
			g.MatMul(out, toGPU(g, x), wg, 1)
			if e := relErr(fromGPU(t, g, out), want); e > 1e-3 {
				t.Errorf("T=%d %+v: relative error %.3g", tiles, sh, e)
			}
		}
	}
}

// TestGemvTMA holds the variants of gemv_nvfp4_tma8 that a default path
// takes to the CPU: persistent or a few tiles per block, a ring of 2 slots
// (wrapping many times per tile) or the deepest that fits, row copies or
// tensor copies (gemv_nvfp4_tma8_tm, its boxes past the last row filled with
// zeros), at the widths of gemvTMAShapes; the SwiGLU and residual epilogues
// are covered by TestDecodeStepFusedAndGraphed, the dev build's variants (16
// consumer warps, three blocks a multiprocessor, other paces) by
// TestGemvTMADev.
func TestGemvTMA(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(17, 18))
	for _, v := range []struct {
		slots, tpb int
		maps       bool
	}{{0, 0, false}, {2, 3, false}, {0, 0, true}, {2, 0, true}} {
		g.force.tmaSlots, g.force.tmaTPB, g.force.tmaRows, g.force.tmaMapsAll = v.slots, v.tpb, !v.maps, v.maps
		for _, sh := range gemvTMAShapes {
			checkGemvTMA(t, g, c, rng, sh[0], sh[1], v.maps, fmt.Sprintf("%+v", v))
		}
	}
}

// gemvTMAShapes are the n x k of TestGemvTMA and TestGemvTMADev: a tile, a
// partial tile, more tiles than blocks, deep K; then partial last stages
// (K % 2048 of 256 to 1536, the whole K under 2048), tiles of 1 to 3 stages
// wrapping a ring of 2 slots at odd offsets.
var gemvTMAShapes = [][2]int{{5, 2048}, {300, 6144}, {4133, 2048}, {700, 4096}, {64, 14336},
	{45, 512}, {300, 1536}, {1000, 2560}, {77, 3072}, {129, 5120}, {33, 9728}, {20, 2304}, {3000, 768}}

// checkGemvTMA holds an m = 1 matmul n x k to the CPU and, when maps is
// set, checks that the weight's tensor maps were encoded.
func checkGemvTMA(t *testing.T, g *Backend, c *cpu.Backend, rng *rand.Rand, n, k int, maps bool, v string) {
	t.Helper()
	h := scaledWeight(rng, backend.NVFP4, n, k)
	wc, wg := uploadBoth(t, g, c, h)
	x := randn(rng, k)
	yc := make(cpu.Buffer, n)
	c.MatMul(yc, cpu.Buffer(x), wc, 1)
	yg := g.NewBuffer(n)
	g.MatMul(yg, toGPU(g, x), wg, 1)
	if e := relErr(fromGPU(t, g, yg), yc); e > 1e-3 {
		t.Errorf("%s %d x %d: relative error %.3g", v, n, k, e)
	}
	if maps && wg.(*Weight).maps == nil {
		t.Errorf("%s %d x %d: no tensor maps encoded", v, n, k)
	}
}

// TestGemvStridedRows holds one-row matmuls that read consecutive slices of
// one buffer (y_j = x_j·W_jᵀ, x_j at a fixed stride, as DeepSeek-V4's grouped
// output projection) to the CPU, and checks how they were joined: up to
// three a launch where each block takes one tile, one a launch otherwise.
func TestGemvStridedRows(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(41, 42))
	for _, tc := range []struct {
		rows, k, groups, stride int
		joined                  bool
	}{
		{1024, 4096, 8, 4096, true}, // three launches (3 + 3 + 2 weights)
		{1000, 2048, 3, 2560, true}, // a gap between the rows; a partial last tile
		{64, 6144, 2, 6144, true},
		{100, 1536, 3, 1536, true},   // a partial stage only
		{3000, 2048, 3, 2048, false}, // 3 x 188 tiles: more than the blocks of one wave
	} {
		ws := make([]backend.Weight, tc.groups)
		wc := make([]backend.Weight, tc.groups)
		for j := range ws {
			h := scaledWeight(rng, backend.NVFP4, tc.rows, tc.k)
			wc[j], _ = c.Upload(h)
			w, err := g.Upload(h)
			if err != nil {
				t.Fatal(err)
			}
			ws[j] = w
		}
		xv := randn(rng, (tc.groups-1)*tc.stride+tc.k)
		x, y := toGPU(g, xv), g.NewBuffer(tc.groups*tc.rows)
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		for j := range ws {
			g.MatMul(g.View(y, j*tc.rows, tc.rows), g.View(x, j*tc.stride, tc.k), ws[j], 1)
		}
		g.qmu.Lock()
		var launches, most int
		for _, o := range g.q.ops {
			if o.gemv != nil {
				launches++
				most = max(most, len(o.gemv.groups))
			}
		}
		g.qmu.Unlock()
		if want := (tc.groups + 2) / 3; tc.joined && (launches != want || most != min(tc.groups, 3)) || !tc.joined && launches != tc.groups {
			t.Errorf("%+v: %d matmul launches, at most %d weights in one", tc, launches, most)
		}
		got := fromGPU(t, g, y)
		for j := range ws {
			yc := make(cpu.Buffer, tc.rows)
			c.MatMul(yc, cpu.Buffer(xv[j*tc.stride:j*tc.stride+tc.k]), wc[j], 1)
			if e := relErr(got[j*tc.rows:(j+1)*tc.rows], yc); e > 1e-3 {
				t.Errorf("%+v weight %d: relative error %.3g", tc, j, e)
			}
		}
	}
}

// TestAttnDecode holds attn_decode and attn_short (one query row; head sizes
// 64 and 128, query heads per kv head 1 to 16, a sliding window, one split
// and many, chunks cut short by the context's end; splits merged in a
// cluster or through global memory; short contexts on attn_short in one
// share or two, its rows copied by each block or multicast, or on
// attn_decode) to the CPU backend at
// 1e-5, as compareAttention: float32 on both sides, different summation
// orders.
func TestAttnDecode(t *testing.T) {
	g, c := newGPU(t), refCPU()
	defer func(f variants) { g.force = f }(g.force)
	rng := rand.New(rand.NewPCG(31, 32))
	spans := [][2]int{{0, 1}, {1, 2}, {2, 33}, {33, 34}, {34, 35}, {35, 100}, {100, 101}, {101, 200}, {200, 201},
		{201, 256}, {256, 257}, {257, 287}, {287, 288}, {288, 384}, {384, 385}, {385, 700}, {700, 701}, {701, 1500},
		{1500, 1501}}
	for _, mode := range []struct{ short, cluster, multicast bool }{
		{true, true, true}, {true, true, false}, {true, false, true}, {false, true, false}, {false, false, false}} {
		g.force.attnNoShort, g.force.attnGlobal, g.force.attnNoCast = !mode.short, !mode.cluster, !mode.multicast
		t.Run(fmt.Sprintf("short=%v/cluster=%v/multicast=%v", mode.short, mode.cluster, mode.multicast), func(t *testing.T) {
			for _, tc := range []struct{ heads, kv, hd, window int }{{8, 2, 128, 0}, {16, 16, 64, 0}, {28, 4, 128, 0}, {32, 2, 64, 50}, {16, 1, 128, 0}} {
				s := layers.AttentionShape{Heads: tc.heads, KVHeads: tc.kv, HeadDim: tc.hd, Window: tc.window}
				compareAttention(t, g, c, rng, s, 2, 1, spans)
			}
		})
	}
}

// TestAttnBackToBack queues one-row attentions for consecutive positions
// with nothing between them, so that each launch's blocks may start while
// the one before (which writes the row they read) still runs: the rows its
// last residentGrids launches wrote are read after the wait (lateRows), and
// every position's output matches the CPU's at TestAttnDecode's tolerance.
// Before that rule, a launch could read the row before its own stale (seen
// as TestAttnTrace's untraced output off by 2.4%, once in six runs).
func TestAttnBackToBack(t *testing.T) {
	g, c := newGPU(t), refCPU()
	defer func(f variants) { g.force = f }(g.force)
	rng := rand.New(rand.NewPCG(37, 38))
	const T = 160
	for _, short := range []bool{true, false} {
		g.force.attnNoShort = !short
		for _, tc := range []struct{ heads, kv, hd int }{{32, 8, 128}, {8, 2, 64}} {
			s := layers.AttentionShape{Heads: tc.heads, KVHeads: tc.kv, HeadDim: tc.hd, Scale: float32(1 / math.Sqrt(float64(tc.hd)))}
			shape := backend.KVShape{Layers: 1, KVHeads: tc.kv, HeadDim: tc.hd, Capacity: T}
			cc, _ := c.NewKVCache(shape)
			gc, err := g.NewKVCache(shape)
			if err != nil {
				t.Fatal(err)
			}
			qr, kr := tc.heads*tc.hd, tc.kv*tc.hd
			q, k, v := randn(rng, T*qr), randn(rng, T*kr), randn(rng, T*kr)
			var qs, ks, vs, outs []backend.Buffer // uploaded before the first launch: nothing between the launches
			for p := range T {
				qs = append(qs, toGPU(g, q[p*qr:(p+1)*qr]))
				ks = append(ks, toGPU(g, k[p*kr:(p+1)*kr]))
				vs = append(vs, toGPU(g, v[p*kr:(p+1)*kr]))
				outs = append(outs, g.NewBuffer(qr))
			}
			for p := range T {
				g.Attention(outs[p], qs[p], ks[p], vs[p], gc, 0, p, 1, s)
			}
			for p := range T {
				want := make(cpu.Buffer, qr)
				c.Attention(want, cpu.Buffer(q[p*qr:(p+1)*qr]), cpu.Buffer(k[p*kr:(p+1)*kr]), cpu.Buffer(v[p*kr:(p+1)*kr]), cc, 0, p, 1, s)
				if e := relErr(fromGPU(t, g, outs[p]), want); e > 1e-5 {
					t.Errorf("short=%v %+v position %d: relative error %.3g", short, tc, p, e)
				}
			}
		}
	}
}

// TestLateRows: which rows before p a one-row attention reads after its
// wait, from the launches that wrote them. Needs no GPU.
func TestLateRows(t *testing.T) {
	c := &kvCache{writes: make([][]kvWrite, 1)}
	c.noteWrite(0, 0, 1)   // a prompt of 100 rows, launch 1
	c.noteWrite(0, 100, 2) // a decode step, launch 2
	for _, tc := range []struct {
		p    int
		now  uint64
		want int
	}{
		{101, 2, lateAll},             // the prompt's launch is recent: every row
		{101, residentGrids, lateAll}, // 127 launches after it: still
		{101, residentGrids + 1, 1},   // the prompt's writer has completed; the step's row not yet
		{101, residentGrids + 2, 0},   // both complete
		{50, 3, lateAll},              // rows below p only: all of them
		{0, 3, 0},                     // no rows before p
	} {
		if got := c.lateRows(0, tc.p, tc.now); got != tc.want {
			t.Errorf("lateRows(p %d, now %d) = %d, want %d", tc.p, tc.now, got, tc.want)
		}
	}
	c.noteWrite(0, 101, 2*residentGrids) // forgets the writes residentGrids back
	if len(c.writes[0]) != 1 {
		t.Errorf("%d writes kept, want 1: %+v", len(c.writes[0]), c.writes[0])
	}
}

// TestAttnDecodeRoPE: a RoPE of q and k queued just before a one-row
// attention runs inside attn_decode; against the CPU's RoPE then attention
// (half and interleaved pairs, every channel rotated or the first half
// only), tolerance as TestAttnDecode's.
func TestAttnDecodeRoPE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(33, 34))
	const heads, kvHeads, hd, T = 8, 2, 128, 300
	s := layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}
	for _, rc := range []struct {
		inter bool
		dim   int
	}{{false, hd}, {true, hd}, {false, hd / 2}} {
		rope := &layers.RoPE{Scale: 1.25, Interleaved: rc.inter, InvFreq: make([]float32, rc.dim/2)}
		for i := range rope.InvFreq {
			rope.InvFreq[i] = float32(math.Pow(10000, -2*float64(i)/float64(rc.dim)))
		}
		shape := backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: T}
		cc, _ := c.NewKVCache(shape)
		gc, err := g.NewKVCache(shape)
		if err != nil {
			t.Fatal(err)
		}
		for pos := 0; pos < T; pos++ {
			q, k, v := randn(rng, heads*hd), randn(rng, kvHeads*hd), randn(rng, kvHeads*hd)
			qc, kc := cpu.Buffer(append([]float32(nil), q...)), cpu.Buffer(append([]float32(nil), k...))
			c.RoPE(qc, 1, heads, hd, 0, pos, rope, false)
			c.RoPE(kc, 1, kvHeads, hd, 0, pos, rope, false)
			want := make(cpu.Buffer, heads*hd)
			c.Attention(want, qc, kc, cpu.Buffer(v), cc, 0, pos, 1, s)
			qg, kg, out := toGPU(g, q), toGPU(g, k), g.NewBuffer(heads*hd)
			vg := toGPU(g, v)
			g.RoPE(qg, 1, heads, hd, 0, pos, rope, false)
			g.RoPE(kg, 1, kvHeads, hd, 0, pos, rope, false)
			g.Attention(out, qg, kg, vg, gc, 0, pos, 1, s)
			g.qmu.Lock()
			for _, o := range g.q.ops {
				if o.rope != nil {
					t.Errorf("rope %+v position %d: the RoPE was not moved into the attention", rc, pos)
				}
			}
			g.qmu.Unlock()
			if pos%37 != 0 && pos != T-1 {
				continue
			}
			if e := relErr(fromGPU(t, g, out), want); e > 1e-5 {
				t.Errorf("rope %+v position %d: relative error %.3g", rc, pos, e)
			}
		}
	}
}

// TestAttnDecodeQKNorm: in-place per-head RMSNorms of q and k (Qwen3's
// q_norm and k_norm), then their RoPE, queued just before a one-row
// attention run inside attn_short or attn_decode (no rmsnorm launch left in
// the queue); against the CPU's norms, RoPE and attention at
// TestAttnDecode's tolerance, with both norms, q's alone and k's alone.
func TestAttnDecodeQKNorm(t *testing.T) {
	g, c := newGPU(t), refCPU()
	defer func(f variants) { g.force = f }(g.force)
	rng := rand.New(rand.NewPCG(35, 36))
	const T = 300
	for _, tc := range []struct {
		heads, kvHeads, hd int
		short, qn, kn      bool
	}{{32, 8, 128, true, true, true}, {32, 8, 128, false, true, true}, {16, 1, 128, true, true, true},
		{8, 2, 64, false, true, true}, {8, 2, 128, true, true, false}, {8, 2, 128, false, false, true}} {
		g.force.attnNoShort = !tc.short
		heads, kvHeads, hd := tc.heads, tc.kvHeads, tc.hd
		s := layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(float64(hd)))}
		rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: 1}, hd)
		if err != nil {
			t.Fatal(err)
		}
		shape := backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: T}
		cc, _ := c.NewKVCache(shape)
		gc, err := g.NewKVCache(shape)
		if err != nil {
			t.Fatal(err)
		}
		qw, kw := randn(rng, hd), randn(rng, hd)
		qwc, kwc, qwg, kwg := cpu.Buffer(qw), cpu.Buffer(kw), toGPU(g, qw), toGPU(g, kw)
		for pos := 0; pos < T; pos++ {
			q, k, v := randn(rng, heads*hd), randn(rng, kvHeads*hd), randn(rng, kvHeads*hd)
			qc, kc := cpu.Buffer(append([]float32(nil), q...)), cpu.Buffer(append([]float32(nil), k...))
			qg, kg, vg, out := toGPU(g, q), toGPU(g, k), toGPU(g, v), g.NewBuffer(heads*hd)
			if tc.qn {
				c.RMSNorm(qc, qc, qwc, 1e-6)
				g.RMSNorm(qg, qg, qwg, 1e-6)
			}
			if tc.kn {
				c.RMSNorm(kc, kc, kwc, 1e-6)
				g.RMSNorm(kg, kg, kwg, 1e-6)
			}
			c.RoPE(qc, 1, heads, hd, 0, pos, rope, false)
			c.RoPE(kc, 1, kvHeads, hd, 0, pos, rope, false)
			want := make(cpu.Buffer, heads*hd)
			c.Attention(want, qc, kc, cpu.Buffer(v), cc, 0, pos, 1, s)
			g.RoPE(qg, 1, heads, hd, 0, pos, rope, false)
			g.RoPE(kg, 1, kvHeads, hd, 0, pos, rope, false)
			g.Attention(out, qg, kg, vg, gc, 0, pos, 1, s)
			g.qmu.Lock()
			for _, o := range g.q.ops {
				if o.hnorm != nil || o.rope != nil {
					t.Errorf("%+v position %d: a norm or the RoPE was not moved into the attention", tc, pos)
				}
			}
			g.qmu.Unlock()
			if pos%37 != 0 && pos != T-1 {
				continue
			}
			if e := relErr(fromGPU(t, g, out), want); e > 1e-5 {
				t.Errorf("%+v position %d: relative error %.3g", tc, pos, e)
			}
		}
	}
}

// TestRoPENorm: in-place per-head RMSNorms of q and k queued before their
// RoPE over many rows (a prompt, or a batch) run inside the RoPE's one launch
// (rope_norm_dyn; no rmsnorm left in the queue); against the CPU's norms
// then RoPE, every channel rotated or some only (off, partial), half and
// interleaved pairs, both tensors normed or one.
func TestRoPENorm(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(39, 40))
	for _, tc := range []struct {
		rows, heads, kvHeads, hd, off int
		partial                       float64
		inter, qn, kn                 bool
	}{
		{512, 16, 8, 128, 0, 1, false, true, true},
		{7, 32, 8, 128, 0, 1, true, true, true},
		{5, 8, 2, 64, 16, 0.5, false, true, true},
		{3, 4, 1, 256, 0, 1, false, true, false},
		{9, 6, 2, 128, 0, 1, false, false, true},
	} {
		r, err := layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: tc.partial}, tc.hd)
		if err != nil {
			t.Fatal(err)
		}
		r.Interleaved = tc.inter
		q, k := randn(rng, tc.rows*tc.heads*tc.hd), randn(rng, tc.rows*tc.kvHeads*tc.hd)
		qw, kw := randn(rng, tc.hd), randn(rng, tc.hd)
		qc, kc := cpu.Buffer(append([]float32(nil), q...)), cpu.Buffer(append([]float32(nil), k...))
		qg, kg := toGPU(g, q), toGPU(g, k)
		if tc.qn {
			c.RMSNorm(qc, qc, cpu.Buffer(qw), 1e-6)
			g.RMSNorm(qg, qg, toGPU(g, qw), 1e-6)
		}
		if tc.kn {
			c.RMSNorm(kc, kc, cpu.Buffer(kw), 1e-6)
			g.RMSNorm(kg, kg, toGPU(g, kw), 1e-6)
		}
		const pos0 = 300
		c.RoPE(qc, tc.rows, tc.heads, tc.hd, tc.off, pos0, r, false)
		c.RoPE(kc, tc.rows, tc.kvHeads, tc.hd, tc.off, pos0, r, false)
		g.RoPE(qg, tc.rows, tc.heads, tc.hd, tc.off, pos0, r, false)
		g.RoPE(kg, tc.rows, tc.kvHeads, tc.hd, tc.off, pos0, r, false)
		g.qmu.Lock()
		ropes := 0
		for _, o := range g.q.ops {
			if o.hnorm != nil {
				t.Errorf("%+v: a norm was left in the queue", tc)
			}
			if o.rope != nil {
				ropes++
			}
		}
		g.qmu.Unlock()
		if ropes != 1 {
			t.Errorf("%+v: %d RoPE launches queued, want 1", tc, ropes)
		}
		if e := relErr(fromGPU(t, g, qg), qc); e > 1e-5 {
			t.Errorf("%+v: q's relative error %.3g", tc, e)
		}
		if e := relErr(fromGPU(t, g, kg), kc); e > 1e-5 {
			t.Errorf("%+v: k's relative error %.3g", tc, e)
		}
	}
}

// uploadBoth puts h on the CPU and the GPU.
func uploadBoth(t testing.TB, g *Backend, c *cpu.Backend, h *backend.HostWeight) (wc, wg backend.Weight) {
	t.Helper()
	wc, err := c.Upload(h)
	if err == nil {
		wg, err = g.Upload(h)
	}
	if err != nil {
		t.Fatal(err)
	}
	return wc, wg
}
