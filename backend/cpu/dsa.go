package cpu

import (
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/quant"
)

// This file implements backend.SparseMLAOps (DeepSeek Sparse Attention and MLA steps):
// the math of layers/dsa and layers/mla.go on the buffers' slices, with the
// AVX2 dot products and axpys, parallel over queries, heads or keys.
// dsa_test.go holds each method to its reference function.

var _ backend.SparseMLAOps = (*Backend)(nil)

// dsaIndices is the CPU's backend.Indices: the selection and a score row.
type dsaIndices struct {
	shape dsa.IndexerShape
	sel   dsa.Selection
	row   []float32
	topk  layers.TopKScratch
}

func (x *dsaIndices) Rows() int { return x.sel.Rows() }

// LayerNorm is layers.LayerNorm over rows of len(w).
func (b *Backend) LayerNorm(dst, x, w, bias backend.Buffer, eps float32) {
	layers.LayerNorm(dst.(Buffer), x.(Buffer), w.(Buffer), bias.(Buffer), eps)
}

// NewIndices allocates an empty selection.
func (b *Backend) NewIndices(s dsa.IndexerShape) (backend.Indices, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &dsaIndices{shape: s}, nil
}

// IndexerSelect is dsa.Indexer.Select. With at least as many queries as
// threads, queries run in parallel; with fewer (decoding), each query's
// keys are scored in parallel.
func (b *Backend) IndexerSelect(idx backend.Indices, q, w, keys backend.Buffer, m, nKeys, pos0 int) {
	x := idx.(*dsaIndices)
	s := x.shape
	qs, ws, ks := q.(Buffer), w.(Buffer), keys.(Buffer)
	dsa.PrepareWeights(ws[:m*s.Heads], s)
	x.sel.Resize(m, min(s.TopK, nKeys))
	scale := s.ScoreScale()
	hd := s.Heads * s.HeadDim
	score := func(row []float32, i, lo, hi int) {
		dsaScore(row[lo:hi], qs[i*hd:(i+1)*hd], ws[i*s.Heads:(i+1)*s.Heads], ks[lo*s.HeadDim:hi*s.HeadDim], s.Heads, s.HeadDim, scale)
	}
	selectRow := func(row []float32, i int, sc *layers.TopKScratch) {
		v := min(pos0+i+1, nKeys)
		for t := v; t < nKeys; t++ {
			row[t] = float32(math.Inf(-1))
		}
		got := dsa.Select(x.sel.Idx[i*x.sel.K:(i+1)*x.sel.K], row, v, s.TopK, sc)
		x.sel.N[i] = int32(len(got))
	}
	if m >= b.threads {
		b.parallel(m, 1, func(lo, hi int) {
			row := make([]float32, nKeys)
			var sc layers.TopKScratch
			for i := lo; i < hi; i++ {
				score(row, i, 0, min(pos0+i+1, nKeys))
				selectRow(row, i, &sc)
			}
		})
		return
	}
	if cap(x.row) < nKeys {
		x.row = make([]float32, nKeys)
	}
	row := x.row[:nKeys]
	for i := range m {
		v := min(pos0+i+1, nKeys)
		b.parallel(v, 64, func(lo, hi int) { score(row, i, lo, hi) })
		selectRow(row, i, &x.topk)
	}
}

// dsaScore is dsa.Score on the AVX2 dot product: dst[t] = Σ_h w[h]·ReLU(scale·q[h]·k[t]).
func dsaScore(dst, q, w, keys []float32, heads, d int, scale float32) {
	for t := range dst {
		k := keys[t*d : (t+1)*d]
		var acc float32
		for h := range heads {
			if dot := dotF32(q[h*d:(h+1)*d], k) * scale; dot > 0 {
				acc += w[h] * dot
			}
		}
		dst[t] = acc
	}
}

// dsaJobs splits m queries × heads into jobs of whole head ranges so that a
// single decoding query still spreads over every thread.
func (b *Backend) dsaJobs(m, heads int, fn func(i, h0, h1 int)) {
	per := heads
	if m < b.threads {
		per = max(1, heads/max(1, b.threads/m))
	}
	parts := (heads + per - 1) / per
	b.parallel(m*parts, 1, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			i, sl := j/parts, j%parts
			fn(i, sl*per, min(heads, (sl+1)*per))
		}
	})
}

// softmaxRow turns logits into probabilities in place (the max subtracted).
func softmaxRow(p []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range p {
		mx = max(mx, v)
	}
	dsa.Normalize(p, mx)
}

// SparseMLAAttention is dsa.AttendMLA for each query, on AVX2 dots and axpys.
func (b *Backend) SparseMLAAttention(out, q, kv, kRope backend.Buffer, idx backend.Indices, m int, s layers.MLAShape, scale float32) {
	sel := &idx.(*dsaIndices).sel
	o, qs, kvs, kr := out.(Buffer), q.(Buffer), kv.(Buffer), kRope.(Buffer)
	nd, rd, vd, qk := s.NopeDim, s.RopeDim, s.VDim, s.QKDim()
	per := nd + vd
	row := s.Heads * per
	b.dsaJobs(m, s.Heads, func(i, h0, h1 int) {
		ts := sel.Row(i)
		if len(ts) == 0 {
			panic(fmt.Sprintf("cpu: SparseMLAAttention: query %d selected no keys", i))
		}
		p := make([]float32, len(ts))
		for h := h0; h < h1; h++ {
			qh := qs[(i*s.Heads+h)*qk : (i*s.Heads+h+1)*qk]
			for j, t := range ts {
				base := int(t)*row + h*per
				p[j] = (dotF32(qh[:nd], kvs[base:base+nd]) + dotF32(qh[nd:], kr[int(t)*rd:(int(t)+1)*rd])) * scale
			}
			softmaxRow(p)
			oh := o[(i*s.Heads+h)*vd : (i*s.Heads+h+1)*vd]
			clear(oh)
			for j, t := range ts {
				base := int(t)*row + h*per + nd
				axpyF32(oh, kvs[base:base+vd], p[j])
			}
		}
	})
}

// SparseLatentAttention is dsa.AttendLatent for each query, on AVX2 dots and
// axpys; each cached latent row is read once for the job's heads.
func (b *Backend) SparseLatentAttention(out, qLat, q, latent, kRope backend.Buffer, idx backend.Indices, m int, s layers.MLAShape, scale float32) {
	sel := &idx.(*dsaIndices).sel
	o, ql, qs, lat, kr := out.(Buffer), qLat.(Buffer), q.(Buffer), latent.(Buffer), kRope.(Buffer)
	r, qk, rd, nd := s.KVLoraRank, s.QKDim(), s.RopeDim, s.NopeDim
	b.dsaJobs(m, s.Heads, func(i, h0, h1 int) {
		ts := sel.Row(i)
		n := len(ts)
		if n == 0 {
			panic(fmt.Sprintf("cpu: SparseLatentAttention: query %d selected no keys", i))
		}
		p := make([]float32, (h1-h0)*n)
		for j, t := range ts {
			c := lat[int(t)*r : (int(t)+1)*r]
			kt := kr[int(t)*rd : (int(t)+1)*rd]
			for h := h0; h < h1; h++ {
				qh := qs[(i*s.Heads+h)*qk+nd : (i*s.Heads+h+1)*qk]
				p[(h-h0)*n+j] = (dotF32(ql[(i*s.Heads+h)*r:(i*s.Heads+h+1)*r], c) + dotF32(qh, kt)) * scale
			}
		}
		for h := h0; h < h1; h++ {
			softmaxRow(p[(h-h0)*n : (h-h0+1)*n])
		}
		clear(o[(i*s.Heads+h0)*r : (i*s.Heads+h1)*r])
		for j, t := range ts {
			c := lat[int(t)*r : (int(t)+1)*r]
			for h := h0; h < h1; h++ {
				axpyF32(o[(i*s.Heads+h)*r:(i*s.Heads+h+1)*r], c, p[(h-h0)*n+j])
			}
		}
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
	case w.dq != nil:
		w.dq.DequantizeRow(dst[:n], r)
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
					axpyF32(ql[(i*s.Heads+h)*r:(i*s.Heads+h+1)*r], row, qs[i*s.Heads*qk+h*qk+c])
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
				wr := h*per + nd + c
				if w.bf16 != nil { // dot straight from the stored bf16 row
					for i := range m {
						o[(i*s.Heads+h)*vd+c] = dotBF16(ol[(i*s.Heads+h)*r:(i*s.Heads+h+1)*r], w.bf16[wr*r:(wr+1)*r])
					}
					continue
				}
				weightRow(row, w, wr)
				for i := range m {
					o[(i*s.Heads+h)*vd+c] = dotF32(ol[(i*s.Heads+h)*r:(i*s.Heads+h+1)*r], row)
				}
			}
		}
	})
}

func axpyF32Go(y, x []float32, a float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}
