package cpu

import (
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

var _ backend.PagedAttentionOps = (*Backend)(nil)

// blockPool stores, per layer, key and value rows as [block, row, kvHead,
// headDim].
type blockPool struct {
	shape backend.PagedShape
	k, v  [][]float32
}

func (p *blockPool) Shape() backend.PagedShape { return p.shape }
func (p *blockPool) Bytes() int64 {
	s := p.shape
	return int64(2*s.Layers*s.Blocks*s.BlockSize*s.KVHeads*s.HeadDim) * 4
}

// NewBlockPool allocates the whole pool up front.
func (b *Backend) NewBlockPool(s backend.PagedShape) (backend.BlockPool, error) {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.BlockSize <= 0 || s.Blocks <= 0 {
		return nil, fmt.Errorf("cpu: bad block pool shape %+v", s)
	}
	p := &blockPool{shape: s, k: make([][]float32, s.Layers), v: make([][]float32, s.Layers)}
	per := s.Blocks * s.BlockSize * s.KVHeads * s.HeadDim
	for l := range p.k {
		p.k[l], p.v[l] = make([]float32, per), make([]float32, per)
	}
	return p, nil
}

// PagedAppend writes k and v through the block table.
func (b *Backend) PagedAppend(pool backend.BlockPool, layer int, k, v backend.Buffer, table []int32, pos0, m int) {
	p := pool.(*blockPool)
	s := p.shape
	if need := (pos0 + m + s.BlockSize - 1) / s.BlockSize; need > len(table) {
		panic(fmt.Sprintf("cpu: paged append at positions [%d, %d) past a table of %d blocks of %d", pos0, pos0+m, len(table), s.BlockSize))
	}
	w := s.KVHeads * s.HeadDim
	layers.PagedWrite(p.k[layer], k.(Buffer), table, s.BlockSize, w, pos0, m)
	layers.PagedWrite(p.v[layer], v.(Buffer), table, s.BlockSize, w, pos0, m)
}

// PagedAppendRoPE rotates and appends each sequence's rows in turn, as
// RoPE and PagedAppend do (the same bits).
func (b *Backend) PagedAppendRoPE(pool backend.BlockPool, layer int, q, k, v backend.Buffer, seqs []layers.PagedSeq, heads int, r *layers.RoPE) {
	s := pool.(*blockPool).shape
	hd := s.HeadDim
	qw, kw := heads*hd, s.KVHeads*hd
	row := 0
	for _, sq := range seqs {
		qs, ks := b.View(q, row*qw, sq.Rows*qw), b.View(k, row*kw, sq.Rows*kw)
		if r != nil {
			b.RoPE(qs, sq.Rows, heads, hd, 0, sq.Pos0, r, false)
			b.RoPE(ks, sq.Rows, s.KVHeads, hd, 0, sq.Pos0, r, false)
		}
		b.PagedAppend(pool, layer, ks, b.View(v, row*kw, sq.Rows*kw), sq.Table, sq.Pos0, sq.Rows)
		row += sq.Rows
	}
}

// CopyBlock copies block src to dst in every layer.
func (b *Backend) CopyBlock(pool backend.BlockPool, dst, src int) {
	p := pool.(*blockPool)
	n := p.shape.BlockSize * p.shape.KVHeads * p.shape.HeadDim
	for l := range p.k {
		copy(p.k[l][dst*n:(dst+1)*n], p.k[l][src*n:(src+1)*n])
		copy(p.v[l][dst*n:(dst+1)*n], p.v[l][src*n:(src+1)*n])
	}
}

// PagedAttention attends each (query row, head) pair over its sequence's
// keys, parallel over the pairs of every sequence. Its sums are those of
// Attention's per-head path (same order, same kernels), so that a sequence
// gives the same bits paged as in its own KVCache where Attention takes
// that path (query heads a KV head not a multiple of 4); where it takes 4
// heads a pass (attn4.go), to float32 rounding.
func (b *Backend) PagedAttention(out, q backend.Buffer, pool backend.BlockPool, layer int, seqs []layers.PagedSeq, s layers.AttentionShape) {
	p := pool.(*blockPool)
	bs, hd := p.shape.BlockSize, s.HeadDim
	keys, values := p.k[layer], p.v[layer]
	o, qs := out.(Buffer), q.(Buffer)
	group := s.Heads / s.KVHeads
	// seqOf[r] is the sequence of query row r.
	var seqOf []int32
	longest := 0
	for i, sq := range seqs {
		if need := (sq.Pos0 + sq.Rows + bs - 1) / bs; need > len(sq.Table) {
			panic(fmt.Sprintf("cpu: paged attention of sequence %d at positions [%d, %d) past a table of %d blocks of %d", i, sq.Pos0, sq.Pos0+sq.Rows, len(sq.Table), bs))
		}
		for range sq.Rows {
			seqOf = append(seqOf, int32(i))
		}
		longest = max(longest, sq.Pos0+sq.Rows)
	}
	first := make([]int, len(seqs)) // first query row of each sequence
	for i := 1; i < len(seqs); i++ {
		first[i] = first[i-1] + seqs[i-1].Rows
	}
	b.parallel(len(seqOf)*s.Heads, 1, func(lo, hi int) {
		scores := make([]float32, longest)
		rows := make([]int, longest) // pool row of each position
		acc := make([]float32, hd)
		for job := lo; job < hi; job++ {
			r, h := job/s.Heads, job%s.Heads
			sq := seqs[seqOf[r]]
			pos := sq.Pos0 + r - first[seqOf[r]]
			start, kh := layers.WindowStart(pos, s.Window), h/group
			qv := qs[job*hd : (job+1)*hd]
			mx := float32(math.Inf(-1))
			for t := start; t <= pos; t++ {
				rows[t] = (layers.PagedRow(sq.Table, bs, t)*s.KVHeads + kh) * hd
				scores[t] = dotF32(qv, keys[rows[t]:rows[t]+hd]) * s.Scale
				mx = max(mx, scores[t])
			}
			// The weights' sum and the weighted values in one pass, in
			// Attention's order and precision.
			var sum float32
			clear(acc)
			for t := start; t <= pos; t++ {
				e := expf32(scores[t] - mx)
				sum += e
				axpyF32(acc, values[rows[t]:rows[t]+hd], e)
			}
			inv := 1 / sum
			for j, a := range acc {
				o[job*hd+j] = a * inv
			}
		}
	})
}
