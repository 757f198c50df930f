package conformance

import (
	"fmt"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// mhcCases are the hyper-connection shapes the rows of hyperCases and
// moreHyperCases (all hidden % 4 == 0, n = 4 or fewer, Sinkhorn, an f32
// weight with K % 8 == 0) leave to other kernels on the CUDA backend:
// hidden off 4 and n > 4 (mhc_pre, mhc_post instead of mhc_pre4,
// mhc_post4); n > 4 and mHC-lite (mhc_activate instead of
// mhc_activate16); a projection of more than 32 rows (n = 5: MatMul, then
// mhc_rowscale) and one from a bf16 weight, K % 8 == 0 or not
// (mhc_proj_part_bf16_v, mhc_proj_part_bf16, mhc_proj_part_f32); and the
// fused coefficients (FusedHyperConnectionOps.MHCCoeffsPre: at 1 or 2 rows
// mhc_proj_part's tail, past that the split path), run as its three steps
// on a backend without it.
func mhcCases() []Case {
	var cs []Case
	for _, s := range [][3]int{{2, 4, 102}, {3, 6, 128}, {1, 8, 99}} {
		cs = append(cs, mhcPrePostCase(s[0], s[1], s[2]))
	}
	for _, s := range []struct {
		rows, n, hidden int
		f               backend.Format
		r               mhc.Residual
	}{
		{2, 5, 64, backend.F32, mhc.Sinkhorn},   // mix 35: MatMul + mhc_rowscale; mhc_activate
		{3, 3, 100, backend.F32, mhc.Lite},      // mhc_activate (lite)
		{1, 4, 256, backend.BF16, mhc.Sinkhorn}, // mhc_proj_part_bf16_v
		{5, 4, 99, backend.BF16, mhc.Sinkhorn},  // K = 396: mhc_proj_part_bf16
		{4, 2, 75, backend.F32, mhc.Sinkhorn},   // K = 150: mhc_proj_part_f32
	} {
		cs = append(cs, mhcProjectCase(s.rows, s.n, s.hidden, s.f, s.r))
	}
	for _, s := range []struct {
		rows, n, hidden int
		f               backend.Format
	}{{1, 4, 256, backend.F32}, {2, 4, 96, backend.BF16}, {7, 4, 128, backend.F32}, {3, 2, 100, backend.F32}} {
		cs = append(cs, mhcCoeffsPreCase(s.rows, s.n, s.hidden, s.f))
	}
	return cs
}

// mhcPrePostCase is MHCPre, MHCPost and MHCExpand at one shape.
func mhcPrePostCase(rows, n, hidden int) Case {
	return Case{Op: "HyperConnectionOps.MHCPre,MHCPost,MHCExpand", Shape: fmt.Sprintf("rows=%d/n=%d/C=%d", rows, n, hidden), Tol: 1e-5, Needs: "HyperConnectionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			x, pre, post, res := rnd(rng, rows*n*hidden, 1), rnd(rng, rows*n, 0.5), rnd(rng, rows*n, 0.5), rnd(rng, rows*n*n, 0.5)
			out, emb := rnd(rng, rows*hidden, 1), rnd(rng, rows*hidden, 1)
			wPre, wPost, wExp := make([]float32, rows*hidden), make([]float32, rows*n*hidden), make([]float32, rows*n*hidden)
			mhc.Pre(wPre, x, pre, rows, n, hidden)
			mhc.Post(wPost, x, out, post, res, make([]float32, n*hidden), rows, n, hidden)
			mhc.Expand(wExp, emb, rows, n, hidden)
			h := caps.HyperConnection
			gPre, gPost, gExp := b.NewBuffer(len(wPre)), b.NewBuffer(len(wPost)), b.NewBuffer(len(wExp))
			xb := upload(b, x)
			h.MHCPre(gPre, xb, upload(b, pre), rows, n, hidden)
			h.MHCPost(gPost, xb, upload(b, out), upload(b, post), upload(b, res), rows, n, hidden)
			h.MHCExpand(gExp, upload(b, emb), rows, n, hidden)
			got := append(append(read(b, gPre), read(b, gPost)...), read(b, gExp)...)
			return got, append(append(wPre, wPost...), wExp...)
		}}
}

// mhcMixer makes a mixer of n streams of width hidden.
func mhcMixer(n, hidden int, r mhc.Residual) *mhc.Mixer {
	return must(mhc.New(mhc.Config{Streams: n, Hidden: hidden, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6, Residual: r}))
}

// mhcProjectCase is MHCProject then MHCActivate, fn in format f.
func mhcProjectCase(rows, n, hidden int, f backend.Format, r mhc.Residual) Case {
	shape := fmt.Sprintf("rows=%d/n=%d/C=%d/fn=%s/residual=%d", rows, n, hidden, f, r)
	return Case{Op: "HyperConnectionOps.MHCProject,MHCActivate", Shape: shape, Tol: 2e-5, Needs: "HyperConnectionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			mx := mhcMixer(n, hidden, r)
			fn, hw := weight(rng, f, mx.Config().MixDim(), n*hidden)
			x := rnd(rng, rows*n*hidden, 1)
			return mhcProjectActivate(b, caps.HyperConnection, mx, rows, x, fn, hw, rnd(rng, mx.Config().MixDim(), 0.5))
		}}
}

// mhcProjectActivate runs MHCProject (fn uploaded from hw) and MHCActivate
// over rows of x against mhc.Project and mx.Activate, the activation's
// base given and its scale 0.8, 0.9, 1.1.
func mhcProjectActivate(b backend.Backend, h backend.HyperConnectionOps, mx *mhc.Mixer, rows int, x, fn []float32, hw *backend.HostWeight, base []float32) ([]float32, []float32) {
	n, mix, width := mx.Config().Streams, mx.Config().MixDim(), mx.Config().Width()
	scale := []float32{0.8, 0.9, 1.1}
	logits := make([]float32, rows*mix)
	mhc.Project(logits, x, fn, rows, width, 1e-6)
	co := mhc.Coeffs{Pre: make([]float32, rows*n), Post: make([]float32, rows*n), Res: make([]float32, rows*n*n)}
	wantLogits := append([]float32(nil), logits...)
	mx.Activate(co, logits, base, scale, rows)
	want := append(append(append(wantLogits, co.Pre...), co.Post...), co.Res...)

	w := must(b.Upload(hw))
	lb := b.NewBuffer(rows * mix)
	h.MHCProject(lb, upload(b, x), w, rows, 1e-6)
	got := read(b, lb)
	pre, post, res := b.NewBuffer(rows*n), b.NewBuffer(rows*n), b.NewBuffer(len(co.Res))
	h.MHCActivate(mx, pre, post, res, lb, upload(b, base), upload(b, scale), rows)
	got = append(append(append(got, read(b, pre)...), read(b, post)...), read(b, res)...)
	return got, want
}

// mhcCoeffsPreCase is the fused MHCCoeffsPre (or, without it, MHCProject,
// MHCActivate and MHCPre) against mhc.Project, Activate and Pre.
func mhcCoeffsPreCase(rows, n, hidden int, f backend.Format) Case {
	shape := fmt.Sprintf("rows=%d/n=%d/C=%d/fn=%s", rows, n, hidden, f)
	return Case{Op: "FusedHyperConnectionOps.MHCCoeffsPre", Shape: shape, Tol: 2e-5, Needs: "HyperConnectionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			mx := mhcMixer(n, hidden, mhc.Sinkhorn)
			c := mx.Config()
			mix, width := c.MixDim(), c.Width()
			fn, hw := weight(rng, f, mix, width)
			x := rnd(rng, rows*width, 1)
			base, scale := rnd(rng, mix, 0.5), []float32{0.8, 0.9, 1.1}
			logits := make([]float32, rows*mix)
			mhc.Project(logits, x, fn, rows, width, c.NormEps)
			co := mhc.Coeffs{Pre: make([]float32, rows*n), Post: make([]float32, rows*n), Res: make([]float32, rows*n*n)}
			mx.Activate(co, logits, base, scale, rows)
			dst := make([]float32, rows*hidden)
			mhc.Pre(dst, x, co.Pre, rows, n, hidden)
			want := append(append(append(append(logits, co.Pre...), co.Post...), co.Res...), dst...)

			w := must(b.Upload(hw))
			lb, pre, post, res, db := b.NewBuffer(rows*mix), b.NewBuffer(rows*n), b.NewBuffer(rows*n), b.NewBuffer(len(co.Res)), b.NewBuffer(rows*hidden)
			xb, bb, sb := upload(b, x), upload(b, base), upload(b, scale)
			if caps.FusedHyper != nil {
				caps.FusedHyper.MHCCoeffsPre(mx, db, pre, post, res, lb, xb, w, bb, sb, rows)
			} else {
				h := caps.HyperConnection
				h.MHCProject(lb, xb, w, rows, c.NormEps)
				h.MHCActivate(mx, pre, post, res, lb, bb, sb, rows)
				h.MHCPre(db, xb, pre, rows, n, hidden)
			}
			got := append(append(append(append(read(b, lb), read(b, pre)...), read(b, post)...), read(b, res)...), read(b, db)...)
			return got, want
		}}
}
