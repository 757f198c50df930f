package mhc

import "github.com/manifoldlm/manifold/backend"

// Ops is what a backend implements to run hyper-connections on its device,
// one method per step of the fused-kernel split (see the package doc). Rows
// are tokens; every call covers all of them.
type Ops interface {
	// MHCProject is Project: logits [rows, fn.Rows()] from x [rows, fn.Cols()]
	// and fn (hc_*_fn or hc_head.hc_fn, [mix, n*C]).
	MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, normEps float32)
	// MHCActivate is Mixer.Activate: logits [rows, MixDim] (overwritten),
	// base [MixDim] and scale [3] into pre, post [rows, n] and res [rows, n, n].
	MHCActivate(m *Mixer, pre, post, res, logits, base, scale backend.Buffer, rows int)
	// MHCPre is Pre: dst [rows, C] = sum_i pre[rows, i] * x[rows, i, C].
	MHCPre(dst, x, pre backend.Buffer, rows, n, hidden int)
	// MHCPost is Post: dst [rows, n, C] from x [rows, n, C], out [rows, C],
	// post [rows, n] and res [rows, n, n]; dst may be x.
	MHCPost(dst, x, out, post, res backend.Buffer, rows, n, hidden int)
	// MHCHeadActivate turns hc_head logits [rows, n] into collapse weights in
	// place: sigmoid(logit * scale + base[i]) + eps, base [n].
	MHCHeadActivate(pre, base backend.Buffer, scale, eps float32, rows, n int)
	// MHCExpand is Expand: dst [rows, n, C] holds n copies of emb [rows, C].
	MHCExpand(dst, emb backend.Buffer, rows, n, hidden int)
}

// FusedOps is optional: a backend that implements it runs a site's
// coefficients and its Pre in one call (seed 000's fused kernels), with what
// Ops' separate steps leave. Callers use it when the backend has it and fall
// back to MHCProject, MHCActivate and MHCPre otherwise.
type FusedOps interface {
	// MHCCoeffsPre is MHCProject (with m's NormEps), MHCActivate and MHCPre
	// in one: from x [rows, n, C] and the site's fn, base and scale it writes
	// logits [rows, MixDim] (as MHCActivate leaves them), pre and post
	// [rows, n], res [rows, n, n] and dst [rows, C].
	MHCCoeffsPre(m *Mixer, dst, pre, post, res, logits, x backend.Buffer, fn backend.Weight, base, scale backend.Buffer, rows int)
}

// HeadActivate is the reference of Ops.MHCHeadActivate.
func HeadActivate(pre, base []float32, scale, eps float32, rows, n int) {
	for i, v := range pre[:rows*n] {
		pre[i] = Sigmoid(v*scale+base[i%n]) + eps
	}
}
