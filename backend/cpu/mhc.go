package cpu

import (
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// The hyper-connection steps of layers/mhc on the CPU (backend.HyperConnectionOps). Each calls
// the package's reference function, split over tokens where that pays.

var _ backend.HyperConnectionOps = (*Backend)(nil)

// MHCProject is the norm+projection step: the matmul on the raw stream, then
// each row scaled by 1/rms (the same math as normalizing first).
func (b *Backend) MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, normEps float32) {
	b.MatMul(logits, x, fn, rows)
	l, xs := logits.(Buffer), x.(Buffer)
	width, mix := fn.Cols(), fn.Rows()
	for r := 0; r < rows; r++ {
		var ss float64
		for _, v := range xs[r*width : (r+1)*width] {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(width)+float64(normEps)))
		for i := range l[r*mix : (r+1)*mix] {
			l[r*mix+i] *= inv
		}
	}
}

// MHCActivate turns logits into pre, post and the residual matrix.
func (b *Backend) MHCActivate(m *mhc.Mixer, pre, post, res, logits, base, scale backend.Buffer, rows int) {
	co := mhc.Coeffs{Pre: pre.(Buffer), Post: post.(Buffer), Res: res.(Buffer)}
	m.Activate(co, logits.(Buffer), base.(Buffer), scale.(Buffer), rows)
}

// MHCPre collapses the streams, parallel over tokens.
func (b *Backend) MHCPre(dst, x, pre backend.Buffer, rows, n, hidden int) {
	d, xs, p := dst.(Buffer), x.(Buffer), pre.(Buffer)
	b.parallel(rows, max(1, 8192/(n*hidden)), func(lo, hi int) {
		mhc.Pre(d[lo*hidden:hi*hidden], xs[lo*n*hidden:hi*n*hidden], p[lo*n:hi*n], hi-lo, n, hidden)
	})
}

// MHCPost mixes the streams and adds the sub-layer output, parallel over tokens.
func (b *Backend) MHCPost(dst, x, out, post, res backend.Buffer, rows, n, hidden int) {
	d, xs, o, p, r := dst.(Buffer), x.(Buffer), out.(Buffer), post.(Buffer), res.(Buffer)
	b.parallel(rows, max(1, 8192/(n*hidden)), func(lo, hi int) {
		mhc.Post(d[lo*n*hidden:hi*n*hidden], xs[lo*n*hidden:hi*n*hidden], o[lo*hidden:hi*hidden],
			p[lo*n:hi*n], r[lo*n*n:hi*n*n], make([]float32, n), hi-lo, n, hidden)
	})
}

// MHCHeadActivate turns hc_head logits into collapse weights.
func (b *Backend) MHCHeadActivate(pre, base backend.Buffer, scale, eps float32, rows, n int) {
	mhc.HeadActivate(pre.(Buffer), base.(Buffer), scale, eps, rows, n)
}

// MHCExpand copies each embedding into the n streams.
func (b *Backend) MHCExpand(dst, emb backend.Buffer, rows, n, hidden int) {
	mhc.Expand(dst.(Buffer), emb.(Buffer), rows, n, hidden)
}
