package cpu

import (
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// DeepSeek-V4's operations of layers/dsv4 on the CPU (backend.CompressedAttentionOps): each calls
// the package's reference function, split over independent rows (entries,
// queries) across the backend's threads.

var _ backend.CompressedAttentionOps = (*Backend)(nil)

func optional(x backend.Buffer) []float32 {
	if x == nil {
		return nil
	}
	return x.(Buffer)
}

// CompressKV pools compressed entries, parallel over entries.
func (b *Backend) CompressKV(dst, kv, gate, ape, norm backend.Buffer, a dsv4.CompressArgs) {
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

// CompressedIndexTopK scores and selects compressed entries. With several queries
// it splits the queries over threads; a single query (decoding) splits its
// score row instead, which is where a long context spends its time.
func (b *Backend) CompressedIndexTopK(idx, q, keys, weights backend.Buffer, a dsv4.IndexArgs) {
	ix, qs, ks, ws := idx.(Buffer), q.(Buffer), keys.(Buffer), weights.(Buffer)
	if a.M > 1 {
		b.parallel(a.M, 1, func(lo, hi int) {
			scores := make([]float32, a.Entries)
			var scratch layers.TopKScratch
			for i := lo; i < hi; i++ {
				v4IndexScores(scores, qs[i*a.Heads*a.Dim:(i+1)*a.Heads*a.Dim], ks, ws[i*a.Heads:(i+1)*a.Heads], a, i, 0, a.Entries)
				v4Select(ix[i*a.TopK:(i+1)*a.TopK], scores, a, i, &scratch)
			}
		})
		return
	}
	scores := make([]float32, a.Entries)
	b.parallel(a.Entries, max(1, 4096/(a.Heads*a.Dim)), func(lo, hi int) {
		v4IndexScores(scores, qs, ks, ws, a, 0, lo, hi)
	})
	v4Select(ix[:a.TopK], scores, a, 0, nil)
}

// v4IndexScores fills scores[lo:hi] for query i as dsv4.IndexTopK scores them.
func v4IndexScores(scores, q, keys, w []float32, a dsv4.IndexArgs, i, lo, hi int) {
	vis := min(dsv4.Visible(a.Pos0+i, a.Rate), a.Entries)
	for e := lo; e < hi; e++ {
		if e >= vis {
			scores[e] = float32(math.Inf(-1))
			continue
		}
		k := keys[e*a.Dim : (e+1)*a.Dim]
		var s float32
		for h := 0; h < a.Heads; h++ {
			if d := dotF32(q[h*a.Dim:(h+1)*a.Dim], k); d > 0 {
				s += d * a.Scale * w[h]
			}
		}
		scores[e] = s
	}
}

// v4Select writes query i's picks (float-coded, -1 padded) from its scores.
func v4Select(dst, scores []float32, a dsv4.IndexArgs, i int, scratch *layers.TopKScratch) {
	for j := range dst {
		dst[j] = -1
	}
	k := min(a.TopK, a.Entries)
	if k == 0 {
		return
	}
	vis := min(dsv4.Visible(a.Pos0+i, a.Rate), a.Entries)
	for j, e := range dsa.Select(make([]int32, k), scores, vis, k, scratch) {
		dst[j] = float32(e)
	}
}

// CompressedAttention attends, parallel over (query, head) pairs so that a single
// decoding query uses every thread. Keys are read in place (no gather).
func (b *Backend) CompressedAttention(out, q, local, comp, idx, sinks backend.Buffer, a dsv4.AttnArgs) {
	o, qs, loc, cs, ix, sk := out.(Buffer), q.(Buffer), local.(Buffer), optional(comp), optional(idx), sinks.(Buffer)
	b.parallel(a.M*a.Heads, 1, func(lo, hi int) {
		rows := make([][]float32, 0, a.MaxKeys())
		scores := make([]float32, a.MaxKeys())
		last := -1
		for job := lo; job < hi; job++ {
			i, h := job/a.Heads, job%a.Heads
			if i != last {
				rows, last = dsv4.KeyRows(rows[:0], loc, cs, ix, a, i), i
			}
			off := job * a.Dim
			v4SinkHead(o[off:off+a.Dim], qs[off:off+a.Dim], rows, sk[h], scores, a.Scale)
		}
	})
}

// v4SinkHead is dsv4.SinkAttention for one head with the vector kernels.
func v4SinkHead(out, q []float32, rows [][]float32, sink float32, scores []float32, scale float32) {
	mx := sink
	for j, r := range rows {
		s := dotF32(q, r) * scale
		scores[j] = s
		mx = max(mx, s)
	}
	sum := float32(math.Exp(float64(sink - mx)))
	for j := range rows {
		e := float32(math.Exp(float64(scores[j] - mx)))
		scores[j] = e
		sum += e
	}
	clear(out)
	inv := 1 / sum
	for j, r := range rows {
		axpyF32(out, r, scores[j]*inv)
	}
}

// Transpose swaps the outer axes of [a, b, w].
func (b *Backend) Transpose(dst, src backend.Buffer, a, bb, w int) {
	dsv4.Transpose(dst.(Buffer), src.(Buffer), a, bb, w)
}

// GroupedMatMul multiplies group j of every row of x by ws[j]ᵀ into group j
// of dst's row: the rows of one group are gathered (a transpose, unless m
// is 1) so that each weight is read once for all of them.
func (b *Backend) GroupedMatMul(dst, x backend.Buffer, ws []backend.Weight, m int) {
	G, rows, cols := len(ws), ws[0].Rows(), ws[0].Cols()
	gx, gy := x.(Buffer), dst.(Buffer)
	if m > 1 {
		gx, gy = make(Buffer, m*G*cols), make(Buffer, m*G*rows)
		dsv4.Transpose(gx, x.(Buffer), m, G, cols)
	}
	for j, w := range ws {
		b.MatMul(gy[j*m*rows:(j+1)*m*rows], gx[j*m*cols:(j+1)*m*cols], w, m)
	}
	if m > 1 {
		dsv4.Transpose(dst.(Buffer), gy, G, m, rows)
	}
}
