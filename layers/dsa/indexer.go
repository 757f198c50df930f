package dsa

import (
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/layers"
)

// IndexerShape is the geometry of a lightning indexer.
type IndexerShape struct {
	Heads   int // index_n_heads: query heads scoring each key
	HeadDim int // index_head_dim: channels of each query head and of a key
	RopeDim int // leading channels of each head and key that RoPE rotates (half-split)
	TopK    int // index_topk: keys each query attends to
}

// Validate reports a shape the indexer cannot run, naming the field.
func (s IndexerShape) Validate() error {
	switch {
	case s.Heads <= 0:
		return fmt.Errorf("dsa: indexer heads %d, want > 0", s.Heads)
	case s.HeadDim <= 0:
		return fmt.Errorf("dsa: indexer head dim %d, want > 0", s.HeadDim)
	case s.RopeDim < 0 || s.RopeDim > s.HeadDim || s.RopeDim%2 != 0:
		return fmt.Errorf("dsa: indexer rope dim %d, want even and in [0, %d]", s.RopeDim, s.HeadDim)
	case s.TopK <= 0:
		return fmt.Errorf("dsa: index_topk %d, want > 0", s.TopK)
	}
	return nil
}

// ScoreScale is the factor applied to every q·k dot product: HeadDim^-1/2.
func (s IndexerShape) ScoreScale() float32 { return float32(math.Pow(float64(s.HeadDim), -0.5)) }

// WeightScale is the factor applied to the per-head weights: Heads^-1/2.
func (s IndexerShape) WeightScale() float32 { return float32(math.Pow(float64(s.Heads), -0.5)) }

// RotateHalf applies half-split ("rotate_half", NeoX-style) RoPE in place to
// channels [0, ropeDim) of rows*heads vectors of x. Vector h of row r starts
// at x[r*rowStride + h*headStride]. cos and sin hold ropeDim/2 values per row
// (the angle of pair i of row r at [r*ropeDim/2 + i], attention scaling
// already applied). Channel i < ropeDim/2 pairs with channel i + ropeDim/2:
//
//	x'[i]        = x[i]*cos[i] - x[i+r/2]*sin[i]
//	x'[i+r/2]    = x[i+r/2]*cos[i] + x[i]*sin[i]
//
// which is transformers' apply_rotary_pos_emb with cos = cat(freqs, freqs).
func RotateHalf(x []float32, rows, heads, rowStride, headStride, ropeDim int, cos, sin []float32) {
	half := ropeDim / 2
	for r := range rows {
		c := cos[r*half : (r+1)*half]
		s := sin[r*half : (r+1)*half]
		for h := range heads {
			v := x[r*rowStride+h*headStride:]
			v = v[:ropeDim]
			for i := range half {
				a, b := v[i], v[i+half]
				v[i] = float32(a*c[i]) - float32(b*s[i])
				v[i+half] = float32(b*c[i]) + float32(a*s[i])
			}
		}
	}
}

// PrepareQueries finishes the indexer queries in place: q holds
// wq_b(q_resid) as [rows, Heads, HeadDim]; RoPE is applied to the leading
// RopeDim channels of every head. cos and sin are as for RotateHalf.
func PrepareQueries(q []float32, rows int, s IndexerShape, cos, sin []float32) {
	RotateHalf(q, rows, s.Heads, s.Heads*s.HeadDim, s.HeadDim, s.RopeDim, cos, sin)
}

// PrepareKeys finishes the indexer keys in place: k holds wk(x) as
// [rows, HeadDim]; each row goes through LayerNorm (biased variance, eps,
// weight normW and bias normB) and then RoPE on its leading RopeDim channels.
func PrepareKeys(k []float32, rows int, s IndexerShape, normW, normB []float32, eps float32, cos, sin []float32) {
	d := s.HeadDim
	layers.LayerNorm(k[:rows*d], k[:rows*d], normW, normB, eps)
	RotateHalf(k, rows, 1, d, d, s.RopeDim, cos, sin)
}

// PrepareWeights scales the per-head weights in place: w holds
// weights_proj(x) as [rows, Heads] and is multiplied by Heads^-1/2.
func PrepareWeights(w []float32, s IndexerShape) {
	ws := s.WeightScale()
	for i := range w {
		w[i] *= ws
	}
}

// Score writes the index score of one query against nKeys keys into
// dst[:nKeys]:
//
//	dst[t] = Σ_h w[h] · ReLU(scale · q[h]·keys[t])
//
// q is [Heads, HeadDim], w is [Heads] (already scaled by PrepareWeights),
// keys is [nKeys, HeadDim] and scale is s.ScoreScale(). Keys can be any key
// set: a sequence's tokens or compressed entries.
func Score(dst, q, w, keys []float32, nKeys int, s IndexerShape, scale float32) {
	d := s.HeadDim
	for t := range nKeys {
		k := keys[t*d : (t+1)*d]
		var acc float32
		for h := range s.Heads {
			qh := q[h*d : (h+1)*d]
			var dot float32
			for i, kv := range k {
				dot += qh[i] * kv
			}
			dot *= scale
			if dot > 0 {
				acc += w[h] * dot
			}
		}
		dst[t] = acc
	}
}

// Selection holds the keys chosen for a block of queries: query i attends to
// the keys Row(i), in increasing order.
type Selection struct {
	K   int     // capacity per query: index_topk
	Idx []int32 // [rows, K]
	N   []int32 // [rows]: how many of query i's K slots are used
}

// Rows is the number of queries the selection holds.
func (sel *Selection) Rows() int { return len(sel.N) }

// Row is the selected key indices of query i.
func (sel *Selection) Row(i int) []int32 { return sel.Idx[i*sel.K : i*sel.K+int(sel.N[i])] }

// Resize makes room for rows queries of k keys each, reusing memory.
func (sel *Selection) Resize(rows, k int) {
	sel.K = k
	sel.Idx = slices.Grow(sel.Idx[:0], rows*k)[:rows*k]
	sel.N = slices.Grow(sel.N[:0], rows)[:rows]
}

// Indexer runs the lightning indexer's scoring and selection for blocks of
// queries. It keeps per-worker scratch memory, so one Indexer must not be
// used by two goroutines at once; the zero value is not usable: call
// NewIndexer.
type Indexer struct {
	shape   IndexerShape
	workers int
	rows    [][]float32
	topk    []TopKScratch
}

// NewIndexer returns an indexer of shape s running on up to workers
// goroutines (at least one).
func NewIndexer(s IndexerShape, workers int) (*Indexer, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	workers = max(workers, 1)
	return &Indexer{shape: s, workers: workers, rows: make([][]float32, workers), topk: make([]TopKScratch, workers)}, nil
}

// Shape is the indexer's geometry.
func (ix *Indexer) Shape() IndexerShape { return ix.shape }

// Select scores rows queries against nKeys keys and selects the keys each
// attends to into sel. q is [rows, Heads, HeadDim] (PrepareQueries done), w
// [rows, Heads] (PrepareWeights done), keys [nKeys, HeadDim] (PrepareKeys
// done). Query i sees keys [0, visible(i)); the others score -inf, as under
// the reference's causal mask, and the top-k runs over the whole row of
// nKeys scores, as torch.topk does in the reference, so that ties resolve the
// same way. For a sequence, nKeys is the number of tokens in the cache and
// visible(i) = pos(i)+1.
func (ix *Indexer) Select(sel *Selection, q, w, keys []float32, rows, nKeys int, visible func(i int) int) {
	s := ix.shape
	sel.Resize(rows, min(s.TopK, nKeys))
	if nKeys == 0 {
		clear(sel.N)
		return
	}
	scale := s.ScoreScale()
	hd := s.Heads * s.HeadDim
	parallel(rows, ix.workers, func(wk, i int) {
		if cap(ix.rows[wk]) < nKeys {
			ix.rows[wk] = make([]float32, nKeys)
		}
		row := ix.rows[wk][:nKeys]
		v := min(max(visible(i), 0), nKeys)
		Score(row, q[i*hd:(i+1)*hd], w[i*s.Heads:(i+1)*s.Heads], keys, v, s, scale)
		for t := v; t < nKeys; t++ {
			row[t] = float32(math.Inf(-1))
		}
		got := Select(sel.Idx[i*sel.K:(i+1)*sel.K], row, v, s.TopK, &ix.topk[wk])
		sel.N[i] = int32(len(got))
	})
}

// Select picks the keys one query attends to from its score row: the
// torch.topk(row, min(topK, len(row))) set, keeping only the indices below
// visible (the reference's top-k fills its quota with masked, -inf keys when
// fewer than topK are visible; attention masks those again). The indices are
// written to dst in increasing order and that slice is returned; dst needs
// room for min(topK, len(row)) indices.
func Select(dst []int32, row []float32, visible, topK int, scratch *TopKScratch) []int32 {
	k := min(topK, len(row))
	dst = dst[:k]
	TopK(dst, row, k, false, scratch)
	n := 0
	for _, i := range dst {
		if int(i) < visible {
			dst[n] = i
			n++
		}
	}
	dst = dst[:n]
	slices.Sort(dst)
	return dst
}
