package kernels

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/layers/mhc"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights/convert"
)

// The architecture ops (backend.HyperConnectionOps, backend.CompressedAttentionOps, backend.SparseMLAOps, backend.TreeAttentionOps) on the GPU
// against the CPU backend on random inputs. Tolerances are relative
// (‖gpu − cpu‖ / ‖cpu‖): 1e-5 where both sides run float32 sums in
// different orders (dot products over at most a few thousand terms, expf
// against exp in float64), 1e-6 for sums of a few terms, 0 for pure data
// movement; index selections must be equal.

const opsTol = 1e-5

func check(t *testing.T, name string, got, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i, v := range got {
		if math.IsNaN(float64(v)) != math.IsNaN(float64(want[i])) {
			t.Errorf("%s: value %d is %v, want %v", name, i, v, want[i])
			return
		}
	}
	if e := relErr(got, want); e > tol {
		t.Errorf("%s: relative error %.3g > %g", name, e, tol)
	}
}

// poisoned is a GPU buffer of n NaNs, so that unwritten outputs show.
func poisoned(g *Backend, n int) backend.Buffer {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return toGPU(g, v)
}

func TestMHCOps(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(11, 12))
	for _, tc := range []struct {
		n, hidden, rows int
		res             mhc.Residual
		f               backend.Format
	}{
		{4, 300, 1, mhc.Sinkhorn, backend.F32}, {3, 257, 5, mhc.Sinkhorn, backend.BF16}, {4, 128, 7, mhc.Sinkhorn, backend.BF16},
		{3, 100, 3, mhc.Lite, backend.F32}, {4, 1000, 2, mhc.Lite, backend.F32},
	} {
		cfg := mhc.Config{Streams: tc.n, Hidden: tc.hidden, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6, Residual: tc.res}
		mx, err := mhc.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n, C, rows, mix := tc.n, tc.hidden, tc.rows, cfg.MixDim()
		name := func(s string) string { return s + " " + tc.res.String() + " n=" + string(rune('0'+n)) }
		x := randn(rng, rows*n*C)
		h := hostWeight(rng, tc.f, mix, n*C)
		h.Bias = nil
		wc, _ := c.Upload(h)
		wg, err := g.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		// Project.
		lc := make(cpu.Buffer, rows*mix)
		c.MHCProject(lc, cpu.Buffer(x), wc, rows, cfg.NormEps)
		lg := poisoned(g, rows*mix)
		xg := toGPU(g, x)
		g.MHCProject(lg, xg, wg, rows, cfg.NormEps)
		check(t, name("project"), fromGPU(t, g, lg), lc, opsTol)
		// Activate, from the same logits on both sides.
		logits := randn(rng, rows*mix)
		base, scale := randn(rng, mix), []float32{0.5, 0.8, 1.3}
		pc, qc, rc := make(cpu.Buffer, rows*n), make(cpu.Buffer, rows*n), make(cpu.Buffer, rows*n*n)
		c.MHCActivate(mx, pc, qc, rc, append(cpu.Buffer{}, logits...), cpu.Buffer(base), cpu.Buffer(scale), rows)
		pg, qg, rg := poisoned(g, rows*n), poisoned(g, rows*n), poisoned(g, rows*n*n)
		g.MHCActivate(mx, pg, qg, rg, toGPU(g, logits), toGPU(g, base), toGPU(g, scale), rows)
		check(t, name("activate pre"), fromGPU(t, g, pg), pc, 1e-6)
		check(t, name("activate post"), fromGPU(t, g, qg), qc, 1e-6)
		check(t, name("activate res"), fromGPU(t, g, rg), rc, 1e-6)
		// Pre and Post (in place) with the CPU's coefficients.
		dc := make(cpu.Buffer, rows*C)
		c.MHCPre(dc, cpu.Buffer(x), pc, rows, n, C)
		dg := poisoned(g, rows*C)
		pg2, rg2, qg2 := toGPU(g, pc), toGPU(g, rc), toGPU(g, qc)
		g.MHCPre(dg, xg, pg2, rows, n, C)
		check(t, name("pre"), fromGPU(t, g, dg), dc, 1e-6)
		out := randn(rng, rows*C)
		xc := append(cpu.Buffer{}, x...)
		c.MHCPost(xc, xc, cpu.Buffer(out), qc, rc, rows, n, C)
		g.MHCPost(xg, xg, toGPU(g, out), qg2, rg2, rows, n, C)
		check(t, name("post"), fromGPU(t, g, xg), xc, 1e-6)
		// Head activation and expansion.
		hl := randn(rng, rows*n)
		hb := randn(rng, n)
		hc := append(cpu.Buffer{}, hl...)
		c.MHCHeadActivate(hc, cpu.Buffer(hb), 0.7, 1e-6, rows, n)
		hg := toGPU(g, hl)
		g.MHCHeadActivate(hg, toGPU(g, hb), 0.7, 1e-6, rows, n)
		check(t, name("head activate"), fromGPU(t, g, hg), hc, 1e-6)
		emb := randn(rng, rows*C)
		ec := make(cpu.Buffer, rows*n*C)
		c.MHCExpand(ec, cpu.Buffer(emb), rows, n, C)
		eg := poisoned(g, rows*n*C)
		g.MHCExpand(eg, toGPU(g, emb), rows, n, C)
		check(t, name("expand"), fromGPU(t, g, eg), ec, 0)
	}
}

// TestMHCPrePost holds the stream kernels (mhc_pre4 / mhc_post4 and their
// one-column forms) to the CPU at every stream count the four-column kernels
// specialize (1 to 4) and past it (5, 6), widths that do and do not take
// four columns per thread, and more rows than a grid's rows (65535), which
// the four-column kernels stride over. Same operations in the same order as
// the CPU: the tolerance is float32 rounding only.
func TestMHCPrePost(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(21, 22))
	for _, tc := range []struct{ n, hidden, rows int }{
		{1, 8, 3}, {2, 1028, 2}, {3, 300, 5}, {4, 7168, 3}, {4, 258, 4}, {5, 16, 7}, {6, 40, 2}, {4, 4, 70000},
	} {
		n, C, rows := tc.n, tc.hidden, tc.rows
		name := fmt.Sprintf("n=%d C=%d rows=%d", n, C, rows)
		x := randn(rng, rows*n*C)
		pre, post, res := randn(rng, rows*n), randn(rng, rows*n), randn(rng, rows*n*n)
		dc := make(cpu.Buffer, rows*C)
		c.MHCPre(dc, cpu.Buffer(x), cpu.Buffer(pre), rows, n, C)
		dg := poisoned(g, rows*C)
		xg := toGPU(g, x)
		g.MHCPre(dg, xg, toGPU(g, pre), rows, n, C)
		check(t, name+" pre", fromGPU(t, g, dg), dc, 1e-6)
		out := randn(rng, rows*C)
		xc := append(cpu.Buffer{}, x...)
		c.MHCPost(xc, xc, cpu.Buffer(out), cpu.Buffer(post), cpu.Buffer(res), rows, n, C)
		g.MHCPost(xg, xg, toGPU(g, out), toGPU(g, post), toGPU(g, res), rows, n, C)
		check(t, name+" post", fromGPU(t, g, xg), xc, 1e-6)
	}
}

// The fused projection (mhc_proj_part + mhc_proj_finish) and MHCCoeffsPre
// against the CPU backend: n = 3 and 4, K = n*C not a multiple of the 64-wide
// K slices (and odd, for the scalar loads), B = 1, 2, 5, 64 and 300 (each warp
// split of mhc_proj_part, token tiles not full), f32 and bf16 weights, the
// mHC-lite width (32 rows, four 8-wide tiles), the head's n rows and a
// stream that is not 16-byte aligned; at B <= mhcTailRows (1, 2), MHCCoeffsPre in
// one launch equal to its four launches bit for bit. Tolerance 1e-5 relative, as for the
// float32 dot products: the tensor cores see tf32 parts (x = hi + lo, and
// w = hi + lo for f32 weights), so each product is within about 2^-21 of
// float32's, and the sums are float32 (promoted every 32 columns).
func TestMHCProjectFused(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(21, 22))
	type tcase struct {
		n, hidden int
		res       mhc.Residual
		f         backend.Format
		head      bool  // the head projection: n rows
		misalign  bool  // x one float past a 16-byte boundary
		rows      []int // token counts (nil: 1, 5, 64, 300)
	}
	var cases []tcase
	for _, f := range []backend.Format{backend.BF16, backend.F32} {
		cases = append(cases, tcase{n: 4, hidden: 1000, f: f}, tcase{n: 3, hidden: 257, f: f})
	}
	cases = append(cases, tcase{n: 3, hidden: 520, f: backend.BF16}, tcase{n: 4, hidden: 100, res: mhc.Lite, f: backend.BF16},
		tcase{n: 4, hidden: 300, f: backend.BF16, head: true}, tcase{n: 4, hidden: 1000, f: backend.BF16, misalign: true},
		// V4's width: at 2000 tokens blocks take two tiles, the last one partial.
		tcase{n: 4, hidden: 7168, f: backend.BF16, rows: []int{2000}})
	for _, tc := range cases {
		cfg := mhc.Config{Streams: tc.n, Hidden: tc.hidden, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6, Residual: tc.res}
		mx, err := mhc.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n, C, K, mix := tc.n, tc.hidden, tc.n*tc.hidden, cfg.MixDim()
		if tc.head {
			mix = n
		}
		h := hostWeight(rng, tc.f, mix, K)
		h.Bias = nil
		wc, _ := c.Upload(h)
		wg, err := g.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		rowList := tc.rows
		if rowList == nil {
			rowList = []int{1, 2, 5, 64, 300}
		}
		for _, rows := range rowList {
			name := func(s string) string {
				return fmt.Sprintf("%s %v n=%d C=%d B=%d %v head=%v misalign=%v", s, tc.res, n, C, rows, tc.f, tc.head, tc.misalign)
			}
			x := randn(rng, rows*K)
			var xg backend.Buffer
			if tc.misalign {
				xg = g.View(toGPU(g, append([]float32{0}, x...)), 1, rows*K)
			} else {
				xg = toGPU(g, x)
			}
			lc := make(cpu.Buffer, rows*mix)
			c.MHCProject(lc, cpu.Buffer(x), wc, rows, cfg.NormEps)
			lg := poisoned(g, rows*mix)
			g.MHCProject(lg, xg, wg, rows, cfg.NormEps)
			check(t, name("project"), fromGPU(t, g, lg), lc, opsTol)
			if tc.head {
				continue
			}
			// The fused coefficients and pre against the CPU's three steps.
			base, scale := randn(rng, mix), []float32{0.5, 0.8, 1.3}
			pc, qc, rc := make(cpu.Buffer, rows*n), make(cpu.Buffer, rows*n), make(cpu.Buffer, rows*n*n)
			c.MHCActivate(mx, pc, qc, rc, lc, cpu.Buffer(base), cpu.Buffer(scale), rows)
			dc := make(cpu.Buffer, rows*C)
			c.MHCPre(dc, cpu.Buffer(x), pc, rows, n, C)
			pg, qg, rg, dg := poisoned(g, rows*n), poisoned(g, rows*n), poisoned(g, rows*n*n), poisoned(g, rows*C)
			lg = poisoned(g, rows*mix)
			g.MHCCoeffsPre(mx, dg, pg, qg, rg, lg, xg, wg, toGPU(g, base), toGPU(g, scale), rows)
			check(t, name("fused logits"), fromGPU(t, g, lg), lc, opsTol)
			check(t, name("fused pre"), fromGPU(t, g, pg), pc, opsTol)
			check(t, name("fused post"), fromGPU(t, g, qg), qc, opsTol)
			check(t, name("fused res"), fromGPU(t, g, rg), rc, opsTol)
			check(t, name("fused dst"), fromGPU(t, g, dg), dc, opsTol)
			// At decode sizes the projection's last block finishes the step
			// (mhcTail): the same operations as the four launches, so the
			// same bits.
			g.force.mhcTailOff = true
			ps, qs, rs, ds, ls := poisoned(g, rows*n), poisoned(g, rows*n), poisoned(g, rows*n*n), poisoned(g, rows*C), poisoned(g, rows*mix)
			g.MHCCoeffsPre(mx, ds, ps, qs, rs, ls, xg, wg, toGPU(g, base), toGPU(g, scale), rows)
			g.force.mhcTailOff = false
			for _, o := range []struct {
				what      string
				got, want backend.Buffer
			}{{"logits", lg, ls}, {"pre", pg, ps}, {"post", qg, qs}, {"res", rg, rs}, {"dst", dg, ds}} {
				if got, want := fromGPU(t, g, o.got), fromGPU(t, g, o.want); !slices.EqualFunc(got, want, func(a, b float32) bool {
					return math.Float32bits(a) == math.Float32bits(b)
				}) {
					t.Errorf("%s: one launch and four launches differ in %s", name("fused"), o.what)
				}
			}
		}
	}
}

// TestMHCProjectPlan holds mhc_proj_part's launch shapes to the kernel's
// assumptions (no GPU needed): K slices a multiple of 64 covering the width,
// a 32-wide chunk for every warp of a K group where the width allows, one
// tile per block wherever warps share a slice, shared memory within the
// budget, one wave of blocks past 64 tokens, and the B = 8192, n = 4,
// C = 7168 shape with its busiest block within 5% of an even split.
func TestMHCProjectPlan(t *testing.T) {
	const sms = 132
	for _, tc := range []struct{ rows, k, mix, elem int }{
		{1, 28672, 24, 2}, {5, 771, 15, 4}, {64, 28672, 24, 2}, {65, 4000, 32, 4}, {300, 1028, 4, 2},
		{8192, 28672, 24, 2}, {8192, 28672, 24, 4}, {17, 64, 1, 2}, {3, 1, 1, 4}, {1024, 28672, 24, 2}, {100000, 100, 3, 4},
	} {
		ks, wt, ty, shared, ok := mhcProjPlanShape(tc.rows, tc.k, tc.mix, tc.elem, sms, mhcProjShare)
		if !ok {
			t.Errorf("%+v: no plan", tc)
			continue
		}
		slices, tiles := (tc.k+ks-1)/ks, (tc.rows+16*wt-1)/(16*wt)
		switch {
		case ks%64 != 0 || ks < min(32*(8/wt), (tc.k+63)&^63):
			t.Errorf("%+v: slice %d with %d token groups", tc, ks, wt)
		case wt != 1 && wt != 2 && wt != 4 && wt != 8, 16*wt < min(tc.rows, 128):
			t.Errorf("%+v: %d token groups", tc, wt)
		case wt != 8 && ty != tiles, ty < 1 || ty > tiles:
			t.Errorf("%+v: %d grid rows for %d tiles of %d token groups", tc, ty, tiles, wt)
		case tiles > 1 && slices*ty > 2*sms:
			t.Errorf("%+v: %d x %d blocks", tc, slices, ty)
		case shared > mhcProjShare:
			t.Errorf("%+v: %d bytes of shared memory", tc, shared)
		case slices*ks < tc.k || (slices-1)*ks >= tc.k:
			t.Errorf("%+v: %d slices of %d", tc, slices, ks)
		}
		if tc.rows == 8192 && tc.elem == 2 {
			busiest, even := float64((tiles+ty-1)/ty*ks), float64(tc.k*tiles)/(2*sms)
			if busiest > 1.05*even {
				t.Errorf("%+v: busiest block %.0f columns x tiles, even split %.0f", tc, busiest, even)
			}
		}
	}
}

func TestV4Ops(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(13, 14))
	rope, err := layers.NewRoPE(layers.RoPEParams{Type: "yarn", Theta: 160000, Factor: 16, OriginalMaxPositions: 256, PartialRotaryFactor: 0.25}, 64)
	if err != nil {
		t.Fatal(err)
	}
	rope.Interleaved = true
	// Compressor: HCA and CSA, with and without the previous window.
	for _, a := range []dsv4.CompressArgs{
		{Entries: 3, Rate: 16, Width: 64, Pos0: 32, Eps: 1e-6, RoPE: rope},
		{Entries: 5, Rate: 4, Width: 64, Overlap: true, Pos0: 0, Eps: 1e-6, RoPE: rope},
		{Entries: 2, Rate: 4, Width: 64, Overlap: true, Prev: true, Pos0: 12, Eps: 1e-6, RoPE: rope},
		{Entries: 1, Rate: 128, Width: 200, Eps: 1e-6},
	} {
		rw := a.RowWidth()
		kv, gate := randn(rng, a.SourceRows()*rw), randn(rng, a.SourceRows()*rw)
		ape, norm := randn(rng, a.Rate*rw), randn(rng, a.Width)
		want := make(cpu.Buffer, a.Entries*a.Width)
		c.CompressKV(want, cpu.Buffer(kv), cpu.Buffer(gate), cpu.Buffer(ape), cpu.Buffer(norm), a)
		got := poisoned(g, a.Entries*a.Width)
		g.CompressKV(got, toGPU(g, kv), toGPU(g, gate), toGPU(g, ape), toGPU(g, norm), a)
		check(t, "compress", fromGPU(t, g, got), want, opsTol)
	}
	// Indexer top-k: entries not a multiple of the 64-entry tile, top-k
	// below and above the entries, one and several queries, visible entries
	// ending inside a tile, V4's 64 x 128 indexer over more tiles than blocks.
	for _, a := range []dsv4.IndexArgs{
		{M: 1, Heads: 8, Dim: 32, Entries: 37, TopK: 6, Pos0: 150, Rate: 4},
		{M: 5, Heads: 8, Dim: 32, Entries: 37, TopK: 50, Pos0: 140, Rate: 4},
		{M: 3, Heads: 4, Dim: 64, Entries: 300, TopK: 16, Pos0: 1190, Rate: 4},
		{M: 2, Heads: 4, Dim: 64, Entries: 0, TopK: 8, Pos0: 1, Rate: 4},
		{M: 2, Heads: 64, Dim: 128, Entries: 1000, TopK: 64, Pos0: 3000, Rate: 4},
		{M: 1, Heads: 64, Dim: 128, Entries: 9000, TopK: 512, Pos0: 36100, Rate: 4},
	} {
		a.Scale = float32(1 / math.Sqrt(float64(a.Dim)))
		q, keys, w := randn(rng, a.M*a.Heads*a.Dim), randn(rng, max(a.Entries, 1)*a.Dim), randn(rng, a.M*a.Heads)
		want := make(cpu.Buffer, a.M*a.TopK)
		c.CompressedIndexTopK(want, cpu.Buffer(q), cpu.Buffer(keys), cpu.Buffer(w), a)
		got := poisoned(g, a.M*a.TopK)
		g.CompressedIndexTopK(got, toGPU(g, q), toGPU(g, keys), toGPU(g, w), a)
		if gv := fromGPU(t, g, got); !slices.Equal(gv, want) {
			t.Errorf("index top-k %+v:\nGPU %v\nCPU %v", a, gv, want)
		}
	}
	// Attention: sliding, HCA (past one chunk of keys), CSA with -1 slots,
	// V4's decode shape (64 heads of 512: four groups); v4_attention_mma
	// (several splits, the sinks in the first) and, with it off, v4_attention.
	for _, a := range []dsv4.AttnArgs{
		{M: 3, Heads: 4, Dim: 64, Pos0: 20, Lo: 5, Window: 16},
		{M: 1, Heads: 3, Dim: 64, Pos0: 24000, Lo: 23985, Window: 16, Rate: 16, Entries: 1500},
		{M: 4, Heads: 2, Dim: 128, Pos0: 100, Lo: 85, Window: 16, Rate: 4, TopK: 7, Entries: 26},
		{M: 2, Heads: 3, Dim: 512, Pos0: 300, Lo: 180, Window: 128, Rate: 4, TopK: 37, Entries: 75},
		{M: 1, Heads: 2, Dim: 62, Pos0: 40, Lo: 30, Window: 11, Rate: 8, Entries: 5},
		{M: 1, Heads: 64, Dim: 512, Pos0: 1100, Lo: 973, Window: 128, Rate: 4, TopK: 512, Entries: 275},
	} {
		a.Scale = float32(1 / math.Sqrt(float64(a.Dim)))
		q := randn(rng, a.M*a.Heads*a.Dim)
		local := randn(rng, (a.Pos0+a.M-a.Lo)*a.Dim)
		sinks := randn(rng, a.Heads)
		var comp, idx []float32
		if a.Rate > 0 {
			comp = randn(rng, a.Entries*a.Dim)
		}
		if a.TopK > 0 {
			idx = make([]float32, a.M*a.TopK)
			for i := range idx {
				idx[i] = float32(rng.IntN(a.Entries+3) - 3) // some -1 slots (and -2, -3)
				if idx[i] < 0 {
					idx[i] = -1
				}
			}
		}
		want := make(cpu.Buffer, a.M*a.Heads*a.Dim)
		var cc, ci, gc, gi backend.Buffer
		if comp != nil {
			cc, gc = cpu.Buffer(comp), toGPU(g, comp)
		}
		if idx != nil {
			ci, gi = cpu.Buffer(idx), toGPU(g, idx)
		}
		c.CompressedAttention(want, cpu.Buffer(q), cpu.Buffer(local), cc, ci, cpu.Buffer(sinks), a)
		gq, gl, gs := toGPU(g, q), toGPU(g, local), toGPU(g, sinks)
		for _, mode := range []struct{ off, eight bool }{{false, false}, {false, true}, {true, false}} {
			g.force.attnMMAOff, g.force.attnMMA8 = mode.off, mode.eight
			got := poisoned(g, a.M*a.Heads*a.Dim)
			g.CompressedAttention(got, gq, gl, gc, gi, gs, a)
			check(t, fmt.Sprintf("v4 attention %+v (mma off %v, 8 warps %v)", a, mode.off, mode.eight), fromGPU(t, g, got), want, opsTol)
		}
		g.force.attnMMAOff, g.force.attnMMA8 = false, false
	}
	// Layout moves.
	src := randn(rng, 3*5*7)
	tc := make(cpu.Buffer, len(src))
	c.Transpose(tc, cpu.Buffer(src), 3, 5, 7)
	tg := poisoned(g, len(src))
	g.Transpose(tg, toGPU(g, src), 3, 5, 7)
	check(t, "transpose", fromGPU(t, g, tg), tc, 0)
	testGatherScatter(t, g, c, rng, g.GatherRows, c.GatherRows, g.ScatterAddRows, c.ScatterAddRows)
}

// testGatherScatter checks row gathers and scatter-adds of more rows than
// one launch takes, with repeated rows.
func testGatherScatter(t *testing.T, g *Backend, c *cpu.Backend, rng *rand.Rand,
	gGather, cGather func(dst, src backend.Buffer, rows []int32, w int),
	gScatter, cScatter func(dst, src backend.Buffer, rows []int32, scale []float32, w int)) {
	const w, srcRows = 300, 40
	rows := make([]int32, 333)
	scale := make([]float32, len(rows))
	for i := range rows {
		rows[i] = int32(rng.IntN(srcRows))
		scale[i] = float32(rng.NormFloat64())
	}
	src := randn(rng, srcRows*w)
	gc := make(cpu.Buffer, len(rows)*w)
	cGather(gc, cpu.Buffer(src), rows, w)
	gg := poisoned(g, len(rows)*w)
	gGather(gg, toGPU(g, src), rows, w)
	check(t, "gather", fromGPU(t, g, gg), gc, 0)
	add := randn(rng, len(rows)*w)
	dc := append(cpu.Buffer{}, src...)
	cScatter(dc, cpu.Buffer(add), rows, scale, w)
	dg := toGPU(g, src)
	gScatter(dg, toGPU(g, add), rows, scale, w)
	check(t, "scatter-add", fromGPU(t, g, dg), dc, 1e-6)
}

// TestTopKTies holds topk_select to dsa.Select (layers.TopK, torch's CPU
// algorithm) on rows full of ties, on both of torch's paths (a heap when
// k*64 <= n, else introselect) and both output forms. The GPU rule: every
// visible entry above the k-th largest value T; the entries equal to T too
// when all of them are taken or none is visible; otherwise the block runs
// torch's algorithm itself on that row, so the set is torch's in every case.
func TestTopKTies(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(15, 16))
	for _, tc := range []topKCase{
		{40, 3, 4, 4, 30, false}, {40, 50, 3, 3, 10, false}, {200, 3, 2, 5, 195, false}, {200, 16, 5, 5, 150, false},
		{1000, 10, 3, 3, 997, false}, {1000, 300, 4, 3, 600, false}, {5000, 64, 6, 2, 4998, false},
		{5000, 2048, 8, 2, 4500, false}, {300, 7, 3, 3, 297, true}, {3000, 1, 2, 2, 2998, false}, {129, 129, 2, 2, 100, false},
		// Long rows: several radix chunks per thread, few ties at the k-th value;
		// from 16384 keys and up to 4 rows a cluster per row (tkc_select) and
		// the many-block passes (tkm_), also with ties that decide (block 0
		// falls back to topk_select's way).
		{140000, 2048, 1 << 20, 2, 139995, false}, {70001, 2048, 1 << 30, 1, 60000, false},
		{20000, 100, 3, 2, 19990, false}, {40000, 2048, 1 << 12, 3, 39000, true}, {16384, 16384, 5, 1, 16383, false},
	} {
		for _, path := range []int{topkAuto, topkMany, topkOneBlock} {
			if path != topkAuto && (tc.n < tkmMinKeys || tc.rows > tkmRows) {
				continue // every path is the one-block one
			}
			g.force.topkPath = path
			testTopKCase(t, g, rng, tc)
			if path == topkAuto && tc.n >= tkc16MinKeys && tc.rows <= tkmRows {
				g.force.tkc8 = true // the cluster top-k in clusters of 8 where 16 ran
				testTopKCase(t, g, rng, tc)
				g.force.tkc8 = false
			}
		}
	}
	g.force.topkPath = topkAuto
}

// topKCase: rows of n scores drawn from levels values (nan: some NaN),
// row i seeing min(pos0+i+1, n) of them, top-k k.
type topKCase struct {
	n, k, levels, rows, pos0 int
	nan                      bool
}

func testTopKCase(t *testing.T, g *Backend, rng *rand.Rand, tc topKCase) {
	t.Helper()
	inf := float32(math.Inf(-1))
	scores := make([]float32, tc.rows*tc.n)
	for i := range tc.rows {
		vis := min(tc.pos0+i+1, tc.n)
		for j := range tc.n {
			v := float32(rng.IntN(tc.levels))
			switch {
			case j >= vis:
				v = inf
			case tc.nan && rng.IntN(10) == 0:
				v = float32(math.NaN())
			case rng.IntN(7) == 0:
				v = float32(math.Copysign(0, -1))
			}
			scores[i*tc.n+j] = v
		}
	}
	src := toGPU(g, scores)
	copyScores := func(sp uint64) { g.copyBytes(sp, ptr(src), 4*len(scores)) }
	k := min(tc.k, tc.n)
	cnt, err := g.alloc(4 * tc.rows)
	if err != nil {
		t.Fatal(err)
	}
	sel := toGPU(g, make([]float32, tc.rows*k))
	g.selectTopK(sel, 0, cnt, tc.rows, tc.n, tc.k, k, tc.pos0, 1, copyScores)
	fsel := poisoned(g, tc.rows*tc.k)
	g.selectTopK(fsel, 1, nil, tc.rows, tc.n, tc.k, tc.k, tc.pos0, 1, copyScores)
	counts := fromGPU(t, g, &Buffer{a: cnt, ptr: cnt.ptr, n: tc.rows})
	ints, floats := fromGPU(t, g, sel), fromGPU(t, g, fsel)
	for i := range tc.rows {
		vis := min(tc.pos0+i+1, tc.n)
		want := dsa.Select(make([]int32, k), scores[i*tc.n:(i+1)*tc.n], vis, tc.k, nil)
		var gi []int32
		for _, v := range ints[i*k : i*k+int(math.Float32bits(counts[i]))] {
			gi = append(gi, int32(math.Float32bits(v)))
		}
		var gf []int32
		for j, v := range floats[i*tc.k : (i+1)*tc.k] {
			if j < len(want) {
				gf = append(gf, int32(v))
			} else if v != -1 {
				t.Errorf("n=%d k=%d row %d: float output slot %d is %v, want -1", tc.n, tc.k, i, j, v)
			}
		}
		if !slices.Equal(gi, want) || !slices.Equal(gf, want) {
			t.Errorf("n=%d k=%d row %d (visible %d): GPU %v / %v, CPU %v", tc.n, tc.k, i, vis, gi, gf, want)
		}
	}
}

func TestDSAOps(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(17, 18))
	// LayerNorm in place, rows not a multiple of anything.
	x, w, bias := randn(rng, 7*33), randn(rng, 33), randn(rng, 33)
	lc := append(cpu.Buffer{}, x...)
	c.LayerNorm(lc, lc, cpu.Buffer(w), cpu.Buffer(bias), 1e-6)
	lg := toGPU(g, x)
	g.LayerNorm(lg, lg, toGPU(g, w), toGPU(g, bias), 1e-6)
	check(t, "layernorm", fromGPU(t, g, lg), lc, 1e-6)

	s := layers.MLAShape{Heads: 4, QLoraRank: 32, KVLoraRank: 64, NopeDim: 32, RopeDim: 16, VDim: 32}
	per, qk, r := s.NopeDim+s.VDim, s.QKDim(), s.KVLoraRank
	for _, tc := range []struct {
		topk, nKeys, m int
		f              backend.Format
	}{{16, 77, 1, backend.F32}, {16, 77, 5, backend.BF16}, {200, 77, 3, backend.NVFP4}, {8, 300, 4, backend.F32}} {
		ix := dsa.IndexerShape{Heads: 8, HeadDim: 32, RopeDim: 16, TopK: tc.topk}
		m, L := tc.m, tc.nKeys
		ic, gi, iq, iw, ik := selectBoth(t, c, g, rng, ix, m, L)
		checkSelect(t, g, gi, ix, iq, iw, ik, m, L, fmt.Sprintf("DSA select top-%d of %d", tc.topk, L))
		// Naive MLA over expanded keys and values.
		q, kv, kr := randn(rng, m*s.Heads*qk), randn(rng, L*s.Heads*per), randn(rng, L*s.RopeDim)
		scale := float32(1 / math.Sqrt(float64(qk)))
		oc := make(cpu.Buffer, m*s.Heads*s.VDim)
		c.SparseMLAAttention(oc, cpu.Buffer(q), cpu.Buffer(kv), cpu.Buffer(kr), ic, m, s, scale)
		og := poisoned(g, m*s.Heads*s.VDim)
		qg, krg := toGPU(g, q), toGPU(g, kr)
		g.SparseMLAAttention(og, qg, toGPU(g, kv), krg, gi, m, s, scale)
		check(t, "attend MLA", fromGPU(t, g, og), oc, opsTol)
		// Absorbed path: query absorption, latent attention, output expansion.
		h := hostWeight(rng, tc.f, s.Heads*per, r)
		h.Bias = nil
		wc, _ := c.Upload(h)
		wg, err := g.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		qlc := make(cpu.Buffer, m*s.Heads*r)
		c.MLAAbsorbQuery(qlc, cpu.Buffer(q), wc, m, s)
		qlg := poisoned(g, m*s.Heads*r)
		g.MLAAbsorbQuery(qlg, qg, wg, m, s)
		check(t, "absorb "+tc.f.String(), fromGPU(t, g, qlg), qlc, opsTol)
		lat := randn(rng, L*r)
		olc := make(cpu.Buffer, m*s.Heads*r)
		c.SparseLatentAttention(olc, qlc, cpu.Buffer(q), cpu.Buffer(lat), cpu.Buffer(kr), ic, m, s, scale)
		olg := poisoned(g, m*s.Heads*r)
		g.SparseLatentAttention(olg, toGPU(g, qlc), qg, toGPU(g, lat), krg, gi, m, s, scale)
		check(t, "attend latent", fromGPU(t, g, olg), olc, opsTol)
		ec := make(cpu.Buffer, m*s.Heads*s.VDim)
		c.MLAExpandOutput(ec, olc, wc, m, s)
		eg := poisoned(g, m*s.Heads*s.VDim)
		g.MLAExpandOutput(eg, toGPU(g, olc), wg, m, s)
		check(t, "expand "+tc.f.String(), fromGPU(t, g, eg), ec, opsTol)
	}
	testGatherScatter(t, g, c, rng, g.GatherRows, c.GatherRows, g.ScatterAddRows, c.ScatterAddRows)
}

// TestDSASelectShapes holds IndexerSelect to the layers/dsa indexer at shapes
// that take idx_scores_mma's edges (heads up to 64, a partial 16-head tile;
// key counts not a multiple of the 64-key tile, more tiles than blocks;
// queries whose visible keys end inside a tile), idx_scores_tile's (one and
// two chunks of 64 heads, the second partial; also every mma shape with the
// mma path off), idx_scores' (head dim not a multiple of 4), and several
// calls reusing the kept scores.
func TestDSASelectShapes(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(21, 22))
	gi, err := g.NewIndices(dsa.IndexerShape{Heads: 1, HeadDim: 4, TopK: 1})
	if err != nil {
		t.Fatal(err)
	}
	type shape struct {
		heads, dim, nKeys, topk, m int
		mmaOff                     bool
	}
	var cases []shape
	for _, off := range []bool{false, true} {
		for _, tc := range []shape{
			{72, 20, 130, 16, 3, off}, {64, 128, 200, 2048, 1, off}, {8, 32, 1000, 64, 70, off}, {5, 30, 100, 10, 2, off},
			{130, 16, 64, 8, 1, off}, {20, 64, 333, 50, 2, off}, {64, 128, 20000, 2048, 1, off},
		} {
			cases = append(cases, tc)
		}
	}
	defer func() { g.force.idxMMAOff = false }()
	for _, tc := range cases {
		g.force.idxMMAOff = tc.mmaOff
		ix := dsa.IndexerShape{Heads: tc.heads, HeadDim: tc.dim, RopeDim: 8, TopK: tc.topk}
		gi.(*dsaIndices).shape = ix // one selection across shapes: the kept scores are reused and grown
		m, L := tc.m, tc.nKeys
		pos0 := L - m
		iq, iw, ik := randn(rng, m*ix.Heads*ix.HeadDim), randn(rng, m*ix.Heads), randn(rng, L*ix.HeadDim)
		g.IndexerSelect(gi, toGPU(g, iq), toGPU(g, iw), toGPU(g, ik), m, L, pos0)
		checkSelect(t, g, gi, ix, iq, iw, ik, m, L, fmt.Sprintf("select heads=%d dim=%d top-%d of %d (mma off %v)", tc.heads, tc.dim, tc.topk, L, g.force.idxMMAOff))
	}
}

// TestDSAAttendLatentShapes holds SparseLatentAttention to the CPU at shapes that
// take dsa_attend_split's edges: one and several groups of 16 heads (the last
// one partial), top-k above the context, selections not a multiple of the
// 32-token tile, one split or many (up to the 64 cap) with some empty for
// short rows, kv_lora up to 512 and not a multiple of 256, and shapes that
// fall back to dsa_attend (rank or rope dim not a multiple of 4).
func TestDSAAttendLatentShapes(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(19, 20))
	for _, tc := range []struct {
		heads, la, lb, nKeys, topk, m int
		split                         bool
	}{
		{4, 64, 16, 77, 200, 1, true},     // top-k > context, 3 splits, last 13 tokens
		{20, 512, 64, 300, 100, 1, true},  // 2 groups (4 heads in the second), 4 splits
		{40, 300, 20, 1000, 256, 3, true}, // 3 groups, 3 queries, columns past 256
		{4, 64, 16, 40, 64, 20, true},     // rows of 21..40 selected: empty splits
		{4, 64, 16, 3000, 3000, 1, true},  // the 64-split cap (47 slices of 64 with 132 SMs)
		{4, 64, 16, 320, 40, 300, true},   // prefill: one split, written directly
		{16, 128, 64, 129, 2048, 2, true}, // exactly one group
		{3, 30, 16, 90, 50, 2, false},     // rank not a multiple of 4: dsa_attend
		{18, 64, 18, 90, 50, 1, false},    // rope dim not a multiple of 4: dsa_attend
	} {
		s := layers.MLAShape{Heads: tc.heads, QLoraRank: 16, KVLoraRank: tc.la, NopeDim: 8, RopeDim: tc.lb, VDim: 8}
		ix := dsa.IndexerShape{Heads: 4, HeadDim: 16, RopeDim: 8, TopK: tc.topk}
		m, L, H, qk := tc.m, tc.nKeys, tc.heads, s.QKDim()
		ic, gi, _, _, _ := selectBoth(t, c, g, rng, ix, m, L)
		q, qLat := randn(rng, m*H*qk), randn(rng, m*H*tc.la)
		lat, kr := randn(rng, L*tc.la), randn(rng, L*tc.lb)
		scale := float32(1 / math.Sqrt(float64(qk)))
		latg, krg, og := toGPU(g, lat), toGPU(g, kr), poisoned(g, m*H*tc.la)
		if fits := g.attendSplitFits(tc.la, tc.lb, ptr(og), ptr(latg), ptr(krg)); fits != tc.split {
			t.Errorf("heads %d rank %d rope %d: split path %v, want %v", H, tc.la, tc.lb, fits, tc.split)
		}
		oc := make(cpu.Buffer, m*H*tc.la)
		c.SparseLatentAttention(oc, cpu.Buffer(qLat), cpu.Buffer(q), cpu.Buffer(lat), cpu.Buffer(kr), ic, m, s, scale)
		qLatg, qg := toGPU(g, qLat), toGPU(g, q)
		// dsa_attend_mma where it applies (with 16 warps, then 8, where the
		// rank takes 16), then dsa_attend_split on the same inputs.
		for _, mode := range []struct{ off, eight bool }{{false, false}, {false, true}, {true, false}} {
			g.force.attnMMAOff, g.force.attnMMA8 = mode.off, mode.eight
			if mode.eight && tc.la%128 != 0 {
				continue // the first pass ran the 8-warp kernel already
			}
			kernel, perSM := "dsa_attend_split", 2
			if !tc.split {
				kernel = "dsa_attend"
			} else if g.attendMMAFits(tc.la, tc.lb) {
				kernel, perSM = attendMMAKernel("dsa_attend_mma", g.attendMMAWarps(tc.la)), 1
			}
			splits, per := g.dsaSplits(min(tc.topk, L), m, H, perSM)
			g.SparseLatentAttention(og, qLatg, qg, latg, krg, gi, m, s, scale)
			name := fmt.Sprintf("attend latent heads=%d rank=%d rope=%d keys=%d top-%d m=%d (%s, %d splits of %d)",
				H, tc.la, tc.lb, L, tc.topk, m, kernel, splits, per)
			check(t, name, fromGPU(t, g, og), oc, opsTol)
			og = poisoned(g, m*H*tc.la)
		}
		g.force.attnMMAOff, g.force.attnMMA8 = false, false
	}
}

// TestHTreeOps runs htree attention on both backends over trees of several
// levels (small rate, top-K and top candidates), grown by a prefill, decode
// steps, a truncation and a second chunk. Scores differ by float32 rounding
// only, far from deciding a selection on random inputs, so the outputs
// agree to rounding.
func TestHTreeOps(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(19, 20))
	for _, tc := range []struct {
		opts                htree.Options
		heads, kv, hd, capa int
		partial             float64
		interleaved         bool
	}{
		{htree.Options{Rate: 4, TopK: 8, TopCandidates: 16}, 4, 2, 64, 300, 1, false},
		{htree.Options{Rate: 3, TopK: 5, TopCandidates: 7}, 3, 1, 48, 200, 0.5, true},
		{htree.Options{}, 2, 2, 32, 150, 1, false}, // defaults: exact (dense) at this length
	} {
		rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 10000, PartialRotaryFactor: tc.partial}, tc.hd)
		if err != nil {
			t.Fatal(err)
		}
		rope.Interleaved = tc.interleaved
		shape := htree.CacheShape{Layers: 2, KVHeads: tc.kv, HeadDim: tc.hd, Capacity: tc.capa, Options: tc.opts, RoPE: rope}
		cc, err := c.NewTreeCache(shape)
		if err != nil {
			t.Fatal(err)
		}
		gc, err := g.NewTreeCache(shape)
		if err != nil {
			t.Fatal(err)
		}
		as := layers.AttentionShape{Heads: tc.heads, KVHeads: tc.kv, HeadDim: tc.hd, Scale: float32(1 / math.Sqrt(float64(tc.hd)))}
		steps := [][2]int{{0, tc.capa - 60}, {tc.capa - 60, 1}, {tc.capa - 59, 1}, {tc.capa - 58, 37}}
		for si, st := range steps {
			pos0, m := st[0], st[1]
			if si == 3 {
				// Rewind two positions and go on from there.
				cc.Truncate(pos0 - 2)
				gc.Truncate(pos0 - 2)
				pos0 -= 2
			}
			q, k, v := randn(rng, m*tc.heads*tc.hd), randn(rng, m*tc.kv*tc.hd), randn(rng, m*tc.kv*tc.hd)
			want := make(cpu.Buffer, len(q))
			c.TreeAttention(want, cpu.Buffer(q), cpu.Buffer(k), cpu.Buffer(v), cc, 1, pos0, m, as)
			got := poisoned(g, len(q))
			g.TreeAttention(got, toGPU(g, q), toGPU(g, k), toGPU(g, v), gc, 1, pos0, m, as)
			check(t, "htree", fromGPU(t, g, got), want, 1e-5)
		}
		if cc.Len() != gc.Len() {
			t.Errorf("htree cache lengths: GPU %d, CPU %d", gc.Len(), cc.Len())
		}
	}
}

// runGreedy runs m over ids in one pass (all logits) and greedily from the
// first 20 ids for 24 tokens, as TestGoldenOnGPU does.
func runGreedy(t *testing.T, m model.Model, ids []int32) ([]float32, []int32) {
	t.Helper()
	ctx := context.Background()
	st, err := m.NewState(len(ids) + 24)
	if err != nil {
		t.Fatal(err)
	}
	full, err := m.Forward(ctx, st, ids, true)
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := m.NewState(64)
	logits, err := m.Forward(ctx, st2, ids[:20], false)
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	for range 24 {
		tok := int32(0)
		for i, v := range logits {
			if v > logits[tok] {
				tok = int32(i)
			}
		}
		toks = append(toks, tok)
		if logits, err = m.Forward(ctx, st2, []int32{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	return full, toks
}

// compareModels loads dir on the GPU (g) and the CPU (built with o)
// and returns the largest |logit| difference of a full pass and whether the
// greedy tokens agree (equal, or the GPU follows the CPU's up to exact ties).
func compareModels(t *testing.T, g backend.Backend, dir string, ids []int32, o model.Options) (float64, bool) {
	t.Helper()
	f, err := model.ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mg, err := model.Build(g, f, o)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := model.Build(refCPU(), f, o)
	if err != nil {
		t.Fatal(err)
	}
	gl, gt := runGreedy(t, mg, ids)
	cl, ct := runGreedy(t, mc, ids)
	var d float64
	for i := range gl {
		d = max(d, math.Abs(float64(gl[i]-cl[i])))
		if math.IsNaN(float64(gl[i])) {
			d = math.Inf(1)
		}
	}
	if slices.Equal(gt, ct) {
		return d, true
	}
	// A flip is only a disagreement if the GPU, fed the CPU's tokens, ranks the
	// CPU's choice below its own by more than float32 summation order can
	// explain: near-ties on these tiny random models may go either way.
	same := followsGreedy(t, mg, ids, ct, greedyTieTol)
	t.Logf("greedy tokens differ:\nGPU %v\nCPU %v\nGPU fed the CPU's tokens agrees up to ties within %g: %v", gt, ct, greedyTieTol, same)
	return d, same
}

// greedyTieTol is the logit gap under which two candidates count as tied:
// far above float32 reordering error on these models (~1e-5), far below the
// 2e-2 logit tolerance.
const greedyTieTol = 1e-4

// followsGreedy feeds want (greedy tokens from ids[:20]) through m and reports
// whether at each step want's token is within tol of m's best logit.
func followsGreedy(t *testing.T, m model.Model, ids, want []int32, tol float32) bool {
	t.Helper()
	ctx := context.Background()
	st, _ := m.NewState(64)
	logits, err := m.Forward(ctx, st, ids[:20], false)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range want {
		best := slices.Max(logits)
		if logits[tok] < best-tol {
			t.Logf("step %d: token %d at %.6g, best %.6g", i, tok, logits[tok], best)
			return false
		}
		if i+1 < len(want) {
			if logits, err = m.Forward(ctx, st, []int32{tok}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	return true
}

// requireClose fails unless the logits are within 2e-2 and greedy equal.
func requireClose(t *testing.T, d float64, same bool) {
	t.Helper()
	if d > 2e-2 || math.IsNaN(d) {
		t.Errorf("GPU logits differ from the CPU backend's by %.3g > 2e-2", d)
	}
	if !same {
		t.Error("greedy tokens differ")
	}
	t.Logf("max |GPU - CPU| logit %.3g", d)
}

// TestHTreeGoldenOnGPU runs the golden llama with htree attention (a small
// tree, so that selection happens) on the GPU against the CPU backend.
func TestHTreeGoldenOnGPU(t *testing.T) {
	g := newGPU(t)
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	d, same := compareModels(t, g, dir, ref.InputIDs, model.Options{Attention: model.AttentionOptions{Kind: "htree", HTree: htree.Options{Rate: 4, TopK: 4, TopCandidates: 8}}})
	requireClose(t, d, same)
}

// exactNVFP4 is the GPU backend with its NVFP4 matmuls on the CUDA-core
// kernel, which multiplies float32 activations by the exactly decoded
// weights, instead of the tensor cores' fp16 activations.
type exactNVFP4 struct{ *Backend }

func (e exactNVFP4) MatMul(dst, x backend.Buffer, wt backend.Weight, m int) {
	w := wt.(*Weight)
	if w.format != backend.NVFP4 {
		e.Backend.MatMul(dst, x, wt, m)
		return
	}
	bias := uint64(0)
	if w.bias != nil {
		bias = w.bias.ptr
	}
	e.launch("gemv_nvfp4_any", grid1(w.rows, 8), 256, 0, w.data.ptr, w.scales.ptr, w.global, ptr(x), ptr(dst), bias, w.rows, w.cols, m)
}

// TestNVFP4GoldenOnGPU converts every golden model to NVFP4 and runs it on
// the GPU against the CPU backend. The default tensor-core path rounds the
// activations to fp16 (relative 2^-11): for the dense decoders (Llama, Qwen3:
// no data-dependent discrete choice in the forward pass) it must still give
// logits within 2e-2 and equal greedy tokens. For the DeepSeek decoders it
// moves router logits and indexer scores enough to flip some of these tiny
// random models' expert and key choices, so its difference is logged and must
// stay finite, and the same bound is required of the NVFP4 matmuls on float32
// activations (exactNVFP4), which compute what the CPU computes. On the dense
// decoders exactNVFP4 itself gave wrong logits (max diff 5) on the H100 while
// the production path matched the CPU; its cause is not found yet (a guess:
// its direct launches interleave badly with the backend's decode-step queue),
// so it is not used for them.
func TestNVFP4GoldenOnGPU(t *testing.T) {
	g := newGPU(t)
	root := golden.Dir(t)
	dense := map[string]bool{"llama": true, "qwen3": true} // model_type without routing or top-k selection
	for _, arch := range golden.Models(t) {
		t.Run(arch, func(t *testing.T) {
			src := filepath.Join(root, arch)
			cfg, err := model.LoadConfig(src)
			if err != nil {
				t.Skipf("%v", err)
			}
			ref := golden.Load(t, src)
			out := filepath.Join(t.TempDir(), "nvfp4")
			if _, err := convert.Convert(context.Background(), convert.Options{In: src, Out: out, Workers: 2}); err != nil {
				t.Fatal(err)
			}
			d, same := compareModels(t, g, out, ref.InputIDs, model.Options{})
			t.Logf("tensor-core NVFP4 path: max |GPU - CPU| logit %.3g, greedy equal %v", d, same)
			if dense[cfg.ModelType] {
				requireClose(t, d, same)
				return
			}
			if math.IsInf(d, 0) || math.IsNaN(d) {
				t.Errorf("tensor-core NVFP4: logits not finite")
			}
			d, same = compareModels(t, exactNVFP4{g}, out, ref.InputIDs, model.Options{})
			requireClose(t, d, same)
		})
	}
}

// moeTestExperts uploads n random NVFP4 experts (w1, w3 [ffn, dim], w2 [dim,
// ffn]) to the GPU and, when c is not nil, to the CPU backend: GPU weights,
// then CPU weights, each [3][n].
func moeTestExperts(t testing.TB, g *Backend, c *cpu.Backend, rng *rand.Rand, n, dim, ffn int) (gw, cw [3][]backend.Weight) {
	t.Helper()
	for range n {
		for j, shape := range [][2]int{{ffn, dim}, {ffn, dim}, {dim, ffn}} {
			h := hostWeight(rng, backend.NVFP4, shape[0], shape[1])
			h.Bias = nil
			w, err := g.Upload(h)
			if err != nil {
				t.Fatal(err)
			}
			gw[j] = append(gw[j], w)
			if c == nil {
				continue
			}
			v, err := c.Upload(h)
			if err != nil {
				t.Fatal(err)
			}
			cw[j] = append(cw[j], v)
		}
	}
	return gw, cw
}

// moeHostAdd is the models' host path on the CPU backend: for each of the m
// tokens its picks (idx, w [m, k]) in expert order, out[i] += w * W2
// SwiGLU(W1 x_i, W3 x_i, limit).
func moeHostAdd(c *cpu.Backend, cw [3][]backend.Weight, out, x []float32, idx []int32, w []float32, m, k, dim, ffn int, limit float32) {
	ge, ue, ye := make(cpu.Buffer, ffn), make(cpu.Buffer, ffn), make(cpu.Buffer, dim)
	for i := range m {
		picks := make([]int, k)
		for j := range picks {
			picks[j] = j
		}
		slices.SortFunc(picks, func(p, q int) int { return int(idx[i*k+p] - idx[i*k+q]) })
		xi := cpu.Buffer(x[i*dim : (i+1)*dim])
		for _, j := range picks {
			e := idx[i*k+j]
			c.MatMul(ge, xi, cw[0][e], 1)
			c.MatMul(ue, xi, cw[1][e], 1)
			c.SwiGLU(ge, ge, ue, limit)
			c.MatMul(ye, ge, cw[2][e], 1)
			c.ScatterAddRows(cpu.Buffer(out), ye, []int32{int32(i)}, []float32{w[i*k+j]}, dim)
		}
	}
}

// TestV4MoE holds the device MoE (moe_route, moe_up, moe_down) to the host
// path on the CPU backend: dsv4.Route on the logits, then per token each
// picked expert's W2 SwiGLU(W1 x, W3 x) added in expert order, scaled by its
// weight, to an output that already holds the shared expert. Scored routing
// (sigmoid with a bias, sqrt-softplus without), hashed picks, one token and
// several, with and without the SwiGLU limit; NVFP4 experts of widths that
// are multiples of 32 but not of the 1024-column staging span. Tolerance
// 1e-5 relative, as the other float32 dot products.
func TestV4MoE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(41, 42))
	for _, tc := range []struct {
		m, experts, k, dim, ffn int
		scoring                 dsv4.Scoring
		bias, hash              bool
		limit                   float32
	}{
		{1, 32, 6, 256, 96, dsv4.ScoreSqrtSoftplus, false, false, 10},
		{3, 32, 6, 1056, 64, dsv4.ScoreSigmoid, true, false, 0},
		{2, 8, 2, 128, 1088, dsv4.ScoreSqrtSoftplus, false, true, 7},
		{1, 64, 8, 512, 256, dsv4.ScoreSigmoid, true, true, 0},
	} {
		name := fmt.Sprintf("moe m=%d top-%d of %d, dim %d, ffn %d, scoring %d, bias %v, hash %v, limit %g",
			tc.m, tc.k, tc.experts, tc.dim, tc.ffn, tc.scoring, tc.bias, tc.hash, tc.limit)
		gw, cw := moeTestExperts(t, g, c, rng, tc.experts, tc.dim, tc.ffn)
		var bias []float32
		if tc.bias {
			bias = randn(rng, tc.experts)
		}
		var hash []int32
		if tc.hash {
			for range tc.m {
				for _, e := range rng.Perm(tc.experts)[:tc.k] {
					hash = append(hash, int32(e))
				}
			}
		}
		a := dsv4.RouteArgs{M: tc.m, Experts: tc.experts, K: tc.k, Scoring: tc.scoring, Scale: 1.5}
		x, logits, shared := randn(rng, tc.m*tc.dim), randn(rng, tc.m*tc.experts), randn(rng, tc.m*tc.dim)
		idx, w := make([]int32, tc.m*tc.k), make([]float32, tc.m*tc.k)
		dsv4.Route(idx, w, logits, bias, hash, a)
		want := append([]float32{}, shared...)
		moeHostAdd(c, cw, want, x, idx, w, tc.m, tc.k, tc.dim, tc.ffn, tc.limit)

		ex, err := g.BindExperts(gw[0], gw[1], gw[2], bias)
		if err != nil || ex == nil {
			t.Fatalf("%s: BindExperts: %v, %v", name, ex, err)
		}
		out := toGPU(g, shared)
		g.RoutedMoE(out, toGPU(g, x), toGPU(g, logits), hash, ex, a, tc.limit)
		check(t, name, fromGPU(t, g, out), want, opsTol)
	}
}

// TestGroupMoE holds the device MoE with DeepSeek-V3 / V3.2 routing
// (moe_group_route) to layers.GroupRoute and the host path on the CPU
// backend: group-limited top-k with a correction bias, with and without
// normalization, one token and several, one kept group and several.
// Tolerance as TestV4MoE.
func TestGroupMoE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(43, 44))
	for _, a := range []layers.GroupRouteArgs{
		{M: 1, Experts: 32, K: 6, Groups: 8, TopKGroups: 4, Normalize: true, Scale: 2.5},
		{M: 3, Experts: 64, K: 8, Groups: 8, TopKGroups: 3, Normalize: false, Scale: 1},
		{M: 2, Experts: 16, K: 2, Groups: 4, TopKGroups: 1, Normalize: true, Scale: 1.5},
	} {
		const dim, ffn = 256, 96
		name := fmt.Sprintf("group moe %+v", a)
		gw, cw := moeTestExperts(t, g, c, rng, a.Experts, dim, ffn)
		bias := randn(rng, a.Experts)
		x, logits, shared := randn(rng, a.M*dim), randn(rng, a.M*a.Experts), randn(rng, a.M*dim)
		idx, w := make([]int32, a.M*a.K), make([]float32, a.M*a.K)
		layers.GroupRoute(idx, w, logits, bias, a)
		want := append([]float32{}, shared...)
		moeHostAdd(c, cw, want, x, idx, w, a.M, a.K, dim, ffn, 0)

		ex, err := g.BindExperts(gw[0], gw[1], gw[2], bias)
		if err != nil || ex == nil {
			t.Fatalf("%s: BindExperts: %v, %v", name, ex, err)
		}
		out := toGPU(g, shared)
		g.GroupMoE(out, toGPU(g, x), toGPU(g, logits), ex, a)
		check(t, name, fromGPU(t, g, out), want, opsTol)
	}
}

// checkSelect holds gi, the GPU's IndexerSelect of iq, iw and ik (m
// queries, the last at position L-1), to the layers/dsa indexer's
// selection; name leads each mismatch's error.
func checkSelect(t *testing.T, g *Backend, gi backend.Indices, ix dsa.IndexerShape, iq, iw, ik []float32, m, L int, name string) {
	t.Helper()
	pos0 := L - m
	ref, _ := dsa.NewIndexer(ix, 1)
	wp := append([]float32{}, iw...)
	dsa.PrepareWeights(wp, ix)
	var want dsa.Selection
	ref.Select(&want, iq, wp, ik, m, L, func(i int) int { return pos0 + i + 1 })
	got, err := gi.(*dsaIndices).read(g)
	if err != nil {
		t.Fatal(err)
	}
	for i := range m {
		if !slices.Equal(got[i], want.Row(i)) {
			t.Errorf("%s, query %d: GPU %v, want %v", name, i, got[i], want.Row(i))
		}
	}
}

// selectBoth runs IndexerSelect on the CPU and the GPU over the same random
// indexer queries, weights and keys (m queries, the last at position L - 1)
// and returns both selections and the inputs.
func selectBoth(t *testing.T, c *cpu.Backend, g *Backend, rng *rand.Rand, ix dsa.IndexerShape, m, L int) (ic, gi backend.Indices, iq, iw, ik []float32) {
	t.Helper()
	iq, iw, ik = randn(rng, m*ix.Heads*ix.HeadDim), randn(rng, m*ix.Heads), randn(rng, L*ix.HeadDim)
	var err error
	if ic, err = c.NewIndices(ix); err != nil {
		t.Fatal(err)
	}
	if gi, err = g.NewIndices(ix); err != nil {
		t.Fatal(err)
	}
	c.IndexerSelect(ic, cpu.Buffer(slices.Clone(iq)), cpu.Buffer(slices.Clone(iw)), cpu.Buffer(ik), m, L, L-m)
	g.IndexerSelect(gi, toGPU(g, iq), toGPU(g, iw), toGPU(g, ik), m, L, L-m)
	return ic, gi, iq, iw, ik
}
