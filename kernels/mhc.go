package kernels

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// The hyper-connection steps of layers/mhc on the GPU (mhc.Ops), kernels in
// mhc.cuh. ops_test.go holds each to the CPU backend.

var _ mhc.Ops = (*Backend)(nil)

// mhcMaxStreams is MHC_MAXN of mhc.cuh: the most streams the kernels take.
const mhcMaxStreams = 16

// MHCProject is the projection (a MatMul on the raw stream) followed by each
// row's scale by 1/rms of the stream.
func (b *Backend) MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, normEps float32) {
	if rows <= 0 {
		return
	}
	b.MatMul(logits, x, fn, rows)
	b.launch("mhc_rowscale", [3]int{rows, 1, 1}, 256, 0, ptr(logits), ptr(x), fn.Cols(), fn.Rows(), normEps)
}

// MHCActivate turns the logits into pre, post and the residual matrix, one
// thread per token.
func (b *Backend) MHCActivate(m *mhc.Mixer, pre, post, res, logits, base, scale backend.Buffer, rows int) {
	c := m.Config()
	n := c.Streams
	if n < 1 || n > mhcMaxStreams {
		b.setErr(fmt.Errorf("kernels: mHC with %d streams: the kernels take 1 to %d", n, mhcMaxStreams))
		return
	}
	if rows <= 0 {
		return
	}
	lite := boolInt(c.Residual == mhc.Lite)
	b.launch("mhc_activate", grid1(rows, 64), 64, 0, ptr(pre), ptr(post), ptr(res), ptr(logits), ptr(base), ptr(scale),
		rows, n, c.SinkhornIters, c.Eps, lite, c.ResDim())
}

// MHCPre collapses the streams.
func (b *Backend) MHCPre(dst, x, pre backend.Buffer, rows, n, hidden int) {
	if rows*hidden <= 0 {
		return
	}
	b.launch("mhc_pre", grid1(rows*hidden, 256), 256, 0, ptr(dst), ptr(x), ptr(pre), rows, n, hidden)
}

// MHCPost mixes the streams and adds the sub-layer output; dst may be x.
func (b *Backend) MHCPost(dst, x, out, post, res backend.Buffer, rows, n, hidden int) {
	if n < 1 || n > mhcMaxStreams {
		b.setErr(fmt.Errorf("kernels: mHC with %d streams: the kernels take 1 to %d", n, mhcMaxStreams))
		return
	}
	if rows*hidden <= 0 {
		return
	}
	b.launch("mhc_post", grid1(rows*hidden, 256), 256, 0, ptr(dst), ptr(x), ptr(out), ptr(post), ptr(res), rows, n, hidden)
}

// MHCHeadActivate turns hc_head logits into collapse weights in place.
func (b *Backend) MHCHeadActivate(pre, base backend.Buffer, scale, eps float32, rows, n int) {
	if rows*n <= 0 {
		return
	}
	b.launch("mhc_head_activate", grid1(rows*n, 256), 256, 0, ptr(pre), ptr(base), scale, eps, rows*n, n)
}

// MHCExpand copies each embedding into the n streams.
func (b *Backend) MHCExpand(dst, emb backend.Buffer, rows, n, hidden int) {
	if rows*n*hidden <= 0 {
		return
	}
	b.launch("mhc_expand", grid1(rows*n*hidden, 256), 256, 0, ptr(dst), ptr(emb), rows, n, hidden)
}
