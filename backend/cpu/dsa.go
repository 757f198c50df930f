package cpu

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/quant"
)

// This file implements dsa.Ops (DeepSeek Sparse Attention and MLA steps) by
// calling the reference functions of layers/dsa and layers on the buffers'
// slices, parallel over queries and heads.

var _ dsa.Ops = (*Backend)(nil)

// dsaIndices is the CPU's dsa.Indices: the selection and the indexer's
// per-worker scratch.
type dsaIndices struct {
	ix  *dsa.Indexer
	sel dsa.Selection
}

func (x *dsaIndices) Rows() int { return x.sel.Rows() }

// DSALayerNorm is layers.LayerNorm over rows of len(w).
func (b *Backend) DSALayerNorm(dst, x, w, bias backend.Buffer, eps float32) {
	layers.LayerNorm(dst.(Buffer), x.(Buffer), w.(Buffer), bias.(Buffer), eps)
}

// DSANewIndices allocates a selection with an indexer running on all threads.
func (b *Backend) DSANewIndices(s dsa.IndexerShape) (dsa.Indices, error) {
	ix, err := dsa.NewIndexer(s, b.threads)
	if err != nil {
		return nil, err
	}
	return &dsaIndices{ix: ix}, nil
}

// DSASelect scores and selects, parallel over queries.
func (b *Backend) DSASelect(idx dsa.Indices, q, w, keys backend.Buffer, m, nKeys, pos0 int) {
	x := idx.(*dsaIndices)
	ws := w.(Buffer)
	dsa.PrepareWeights(ws[:m*x.ix.Shape().Heads], x.ix.Shape())
	x.ix.Select(&x.sel, q.(Buffer), ws, keys.(Buffer), m, nKeys, func(i int) int { return pos0 + i + 1 })
}

// dsaJobs splits m queries × heads into jobs of whole head ranges so that a
// single decoding query still spreads over every thread.
func (b *Backend) dsaJobs(m, heads int, fn func(i, h0, h1 int)) {
	per := heads
	if m < b.threads {
		// Split each query's heads in about threads/m slices.
		per = max(1, heads/max(1, b.threads/m))
	}
	slices := (heads + per - 1) / per
	b.parallel(m*slices, 1, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			i, sl := j/slices, j%slices
			fn(i, sl*per, min(heads, (sl+1)*per))
		}
	})
}

// DSAAttendMLA runs dsa.AttendMLA for each query.
func (b *Backend) DSAAttendMLA(out, q, kv, kRope backend.Buffer, idx dsa.Indices, m int, s layers.MLAShape, scale float32) {
	sel := &idx.(*dsaIndices).sel
	o, qs, kvs, kr := out.(Buffer), q.(Buffer), kv.(Buffer), kRope.(Buffer)
	qk, vd := s.QKDim(), s.VDim
	b.dsaJobs(m, s.Heads, func(i, h0, h1 int) {
		rows := sel.Row(i)
		if len(rows) == 0 {
			panic(fmt.Sprintf("cpu: DSAAttendMLA: query %d selected no keys", i))
		}
		p := make([]float32, len(rows))
		dsa.AttendMLAHeads(o[i*s.Heads*vd:(i+1)*s.Heads*vd], qs[i*s.Heads*qk:(i+1)*s.Heads*qk], kvs, kr, rows, s, h0, h1, scale, p)
	})
}

// DSAAttendLatent runs dsa.AttendLatentHeads for each query.
func (b *Backend) DSAAttendLatent(out, qLat, q, latent, kRope backend.Buffer, idx dsa.Indices, m int, s layers.MLAShape, scale float32) {
	sel := &idx.(*dsaIndices).sel
	o, ql, qs, lat, kr := out.(Buffer), qLat.(Buffer), q.(Buffer), latent.(Buffer), kRope.(Buffer)
	r, qk, rd := s.KVLoraRank, s.QKDim(), s.RopeDim
	b.dsaJobs(m, s.Heads, func(i, h0, h1 int) {
		rows := sel.Row(i)
		if len(rows) == 0 {
			panic(fmt.Sprintf("cpu: DSAAttendLatent: query %d selected no keys", i))
		}
		// The rope channels of query i, one head every qk values.
		qr := make([]float32, s.Heads*rd)
		for h := h0; h < h1; h++ {
			copy(qr[h*rd:(h+1)*rd], qs[i*s.Heads*qk+h*qk+s.NopeDim:i*s.Heads*qk+(h+1)*qk])
		}
		p := make([]float32, (h1-h0)*len(rows))
		dsa.AttendLatentHeads(o[i*s.Heads*r:(i+1)*s.Heads*r], ql[i*s.Heads*r:(i+1)*s.Heads*r], qr, lat, kr, rows, h0, h1, r, rd, r, rd, scale, p)
	})
}

// weightRow writes row r of w as float32 into dst.
func weightRow(dst []float32, w *Weight, r int) {
	n := w.cols
	switch {
	case w.f32 != nil:
		copy(dst, w.f32[r*n:(r+1)*n])
	case w.bf16 != nil:
		for j, v := range w.bf16[r*n : (r+1)*n] {
			dst[j] = quant.BF16ToFloat32(v)
		}
	default:
		dequantizeRow(dst, w.q, r)
	}
}

// MLAAbsorbQuery computes qLat[i,h] = W_UK[h]ᵀ q_nope[i,h], parallel over
// heads; each W_UK row is decoded once for all m tokens.
func (b *Backend) MLAAbsorbQuery(qLat, q backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	w := kvB.(*Weight)
	ql, qs := qLat.(Buffer), q.(Buffer)
	r, nd, qk := s.KVLoraRank, s.NopeDim, s.QKDim()
	per := nd + s.VDim
	b.parallel(s.Heads, 1, func(lo, hi int) {
		row := make([]float32, r)
		for h := lo; h < hi; h++ {
			for i := range m {
				clear(ql[(i*s.Heads+h)*r : (i*s.Heads+h+1)*r])
			}
			for c := range nd {
				weightRow(row, w, h*per+c)
				for i := range m {
					a := qs[i*s.Heads*qk+h*qk+c]
					o := ql[(i*s.Heads+h)*r : (i*s.Heads+h+1)*r]
					for j, wv := range row {
						o[j] += a * wv
					}
				}
			}
		}
	})
}

// MLAExpandOutput computes out[i,h] = W_UV[h] outLat[i,h], parallel over heads.
func (b *Backend) MLAExpandOutput(out, outLat backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	w := kvB.(*Weight)
	o, ol := out.(Buffer), outLat.(Buffer)
	r, nd, vd := s.KVLoraRank, s.NopeDim, s.VDim
	per := nd + vd
	b.parallel(s.Heads, 1, func(lo, hi int) {
		row := make([]float32, r)
		for h := lo; h < hi; h++ {
			for c := range vd {
				weightRow(row, w, h*per+nd+c)
				for i := range m {
					x := ol[(i*s.Heads+h)*r : (i*s.Heads+h+1)*r]
					var d float32
					for j, wv := range row {
						d += wv * x[j]
					}
					o[(i*s.Heads+h)*vd+c] = d
				}
			}
		}
	})
}

// DSAGather copies rows of src into dst.
func (b *Backend) DSAGather(dst, src backend.Buffer, rows []int32, w int) {
	d, s := dst.(Buffer), src.(Buffer)
	for i, r := range rows {
		copy(d[i*w:(i+1)*w], s[int(r)*w:(int(r)+1)*w])
	}
}

// DSAScatterAdd adds scaled rows of src into rows of dst.
func (b *Backend) DSAScatterAdd(dst, src backend.Buffer, rows []int32, scale []float32, w int) {
	d, s := dst.(Buffer), src.(Buffer)
	for i, r := range rows {
		o := d[int(r)*w : (int(r)+1)*w]
		a := scale[i]
		for c, v := range s[i*w : (i+1)*w] {
			o[c] += a * v
		}
	}
}
