package cpu

import (
	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// DeepSeek-V4's operations of layers/dsv4 on the CPU (dsv4.Ops): each calls
// the package's reference function, split over independent rows (entries,
// queries) across the backend's threads.

var _ dsv4.Ops = (*Backend)(nil)

func optional(x backend.Buffer) []float32 {
	if x == nil {
		return nil
	}
	return x.(Buffer)
}

// V4Compress pools compressed entries, parallel over entries.
func (b *Backend) V4Compress(dst, kv, gate, ape, norm backend.Buffer, a dsv4.CompressArgs) {
	d, k, g := dst.(Buffer), kv.(Buffer), gate.(Buffer)
	rw := a.RowWidth()
	base := 0 // source row of window 0's first row
	if a.Prev {
		base = a.Rate
	}
	b.parallel(a.Entries, max(1, 4096/(a.Rate*rw)), func(lo, hi int) {
		sub := a
		sub.Entries = hi - lo
		sub.Pos0 = a.Pos0 + lo*a.Rate
		first := base + lo*a.Rate
		// A CSA sub-range starting after window 0 (or after a cached window)
		// takes its predecessor window along as Prev.
		sub.Prev = a.Overlap && first >= a.Rate
		if sub.Prev {
			first -= a.Rate
		}
		n := sub.SourceRows() * rw
		dsv4.Compress(d[lo*a.Width:hi*a.Width], k[first*rw:first*rw+n], g[first*rw:first*rw+n], ape.(Buffer), norm.(Buffer), sub)
	})
}

// V4IndexTopK scores and selects compressed entries, parallel over queries.
func (b *Backend) V4IndexTopK(idx, q, keys, weights backend.Buffer, a dsv4.IndexArgs) {
	ix, qs, ks, ws := idx.(Buffer), q.(Buffer), keys.(Buffer), weights.(Buffer)
	b.parallel(a.M, 1, func(lo, hi int) {
		sub := a
		sub.M = hi - lo
		sub.Pos0 = a.Pos0 + lo
		dsv4.IndexTopK(ix[lo*a.TopK:hi*a.TopK], qs[lo*a.Heads*a.Dim:hi*a.Heads*a.Dim], ks,
			ws[lo*a.Heads:hi*a.Heads], make([]float32, a.Entries), sub)
	})
}

// V4Attention attends, parallel over queries.
func (b *Backend) V4Attention(out, q, local, comp, idx, sinks backend.Buffer, a dsv4.AttnArgs) {
	o, qs, loc, cs, ix, sk := out.(Buffer), q.(Buffer), local.(Buffer), optional(comp), optional(idx), sinks.(Buffer)
	hd := a.Heads * a.Dim
	b.parallel(a.M, 1, func(lo, hi int) {
		keys := make([]float32, a.MaxKeys()*a.Dim)
		scores := make([]float32, a.MaxKeys())
		for i := lo; i < hi; i++ {
			n := dsv4.GatherKeys(keys, loc, cs, ix, a, i)
			dsv4.SinkAttention(o[i*hd:(i+1)*hd], qs[i*hd:(i+1)*hd], keys, sk, scores, a.Heads, a.Dim, n, a.Scale)
		}
	})
}

// V4Transpose swaps the outer axes of [a, b, w].
func (b *Backend) V4Transpose(dst, src backend.Buffer, a, bb, w int) {
	dsv4.Transpose(dst.(Buffer), src.(Buffer), a, bb, w)
}

// V4Gather gathers rows.
func (b *Backend) V4Gather(dst, src backend.Buffer, rows []int32, w int) {
	dsv4.Gather(dst.(Buffer), src.(Buffer), rows, w)
}

// V4ScatterAdd adds scaled rows.
func (b *Backend) V4ScatterAdd(dst, src backend.Buffer, rows []int32, scale []float32, w int) {
	dsv4.ScatterAdd(dst.(Buffer), src.(Buffer), rows, scale, w)
}
