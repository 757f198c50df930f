package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// pagedSeq is a sequence of a paged row: rows queries at pos0..; with share
// > 0 its first share positions are sequence 0's, its full blocks shared
// and a partial last one copied (copy-on-write).
type pagedSeq struct{ pos0, rows, share int }

func pagedCases() []Case {
	var cs []Case
	for _, c := range []struct {
		bs, heads, kv, hd, window int
		seqs                      []pagedSeq
	}{
		{16, 4, 2, 64, 0, []pagedSeq{{0, 7, 0}}},                                         // one prefill, inside a block
		{1, 2, 1, 8, 0, []pagedSeq{{4, 2, 0}}},                                           // blocks of one position
		{5, 8, 2, 100, 0, []pagedSeq{{13, 1, 0}, {0, 9, 0}, {40, 1, 0}, {6, 3, 0}}},      // decode and prefill, lengths off every multiple
		{3, 4, 4, 33, 7, []pagedSeq{{20, 2, 0}, {1, 1, 0}}},                              // sliding window
		{4, 4, 2, 16, 0, []pagedSeq{{10, 3, 0}, {12, 2, 10}, {9, 1, 8}}},                 // a shared prefix: full blocks shared, a partial one copied
		{8, 12, 1, 128, 0, []pagedSeq{{70, 1, 0}, {5, 4, 0}}},                            // 12 query heads a kv head (the GPU: two blocks of 6)
		{16, 8, 2, 128, 0, []pagedSeq{{300, 1, 0}, {20, 1, 0}, {150, 2, 0}}},             // decode at longer contexts (the GPU: split over the keys)
		{16, 8, 2, 128, 0, []pagedSeq{{0, 100, 0}, {40, 1, 0}, {30, 70, 0}, {7, 31, 0}}}, // prompt chunks beside decode rows (the GPU: tiles of 64 rows)
		{16, 4, 2, 64, 50, []pagedSeq{{10, 40, 0}, {3, 1, 0}}},                           // a chunk under a sliding window
		{8, 8, 4, 64, 0, []pagedSeq{{0, 33, 0}, {64, 64, 0}}},                            // chunks only
	} {
		var sh []string
		for _, s := range c.seqs {
			sh = append(sh, fmt.Sprintf("%d+%d~%d", s.pos0, s.rows, s.share))
		}
		as := layers.AttentionShape{Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, Scale: float32(1 / math.Sqrt(float64(c.hd))), Window: c.window}
		cs = append(cs, Case{Op: "PagedAttentionOps.PagedAttention", Tol: 2e-5, Needs: "PagedAttentionOps",
			Shape: fmt.Sprintf("bs=%d/h=%d/kv=%d/d=%d/win=%d/seqs=%s", c.bs, c.heads, c.kv, c.hd, c.window, strings.Join(sh, ",")),
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return pagedAttention(b, caps.Paged, rng, c.bs, as, c.seqs)
			}})
	}
	for _, c := range []struct {
		bs, heads, kv, hd int
		partial           float64 // partial_rotary_factor
		inter             bool
		seqs              []pagedSeq
	}{
		{16, 16, 2, 64, 1, false, []pagedSeq{{37, 1, 0}, {0, 5, 0}, {16, 1, 0}}},          // decode and a prompt, Llama's rotation, 8 query heads a kv head
		{4, 6, 2, 128, 1, false, []pagedSeq{{9, 1, 0}, {3, 2, 0}, {0, 1, 0}, {11, 1, 0}}}, // head groups of 3
		{3, 4, 1, 40, 0.5, true, []pagedSeq{{7, 3, 0}, {2, 1, 0}}},                        // partial, interleaved
		{16, 8, 2, 128, 1, false, []pagedSeq{{0, 48, 0}, {60, 1, 0}}},                     // a prompt chunk
		// Decode rows only: the append may move into the attention.
		{16, 32, 8, 128, 1, false, []pagedSeq{{700, 1, 0}, {5, 1, 0}, {130, 1, 0}, {0, 1, 0}}}, // the 8B shape, split over the keys
		{16, 16, 2, 64, 1, false, []pagedSeq{{37, 1, 0}, {3, 1, 0}}},                           // 8 query heads a kv head
		{8, 24, 2, 128, 1, false, []pagedSeq{{50, 1, 0}, {8, 1, 0}}},                           // 12: two blocks of 6
		{3, 4, 1, 40, 0.5, true, []pagedSeq{{7, 1, 0}, {2, 1, 0}}},                             // partial, interleaved, odd heads
	} {
		var sh []string
		for _, s := range c.seqs {
			sh = append(sh, fmt.Sprintf("%d+%d", s.pos0, s.rows))
		}
		as := layers.AttentionShape{Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, Scale: float32(1 / math.Sqrt(float64(c.hd)))}
		cs = append(cs, Case{Op: "PagedAttentionOps.PagedAppendRoPE", Tol: 2e-5, Needs: "PagedAttentionOps",
			Shape: fmt.Sprintf("bs=%d/h=%d/kv=%d/d=%d/rot=%g/inter=%v/seqs=%s", c.bs, c.heads, c.kv, c.hd, c.partial, c.inter, strings.Join(sh, ",")),
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				r := must(layers.NewRoPE(layers.RoPEParams{Theta: 5e5, PartialRotaryFactor: c.partial}, c.hd))
				r.Interleaved = c.inter
				return pagedAppendRoPE(b, caps.Paged, rng, c.bs, as, r, c.seqs)
			}})
	}
	return cs
}

// pagedPool makes a pool of blocks blocks of bs positions for s's KV heads
// in nLayers layers, the host copies of one layer's keys and values, and
// the pool's blocks shuffled, for the block tables to take.
func pagedPool(ops backend.PagedAttentionOps, rng *rand.Rand, nLayers, bs, blocks int, s layers.AttentionShape) (pool backend.BlockPool, kRef, vRef []float32, free []int) {
	pool = must(ops.NewBlockPool(backend.PagedShape{Layers: nLayers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, BlockSize: bs, Blocks: blocks}))
	w := s.KVHeads * s.HeadDim
	return pool, make([]float32, blocks*bs*w), make([]float32, blocks*bs*w), rng.Perm(blocks)
}

// pagedAttention fills a pool of two layers (layer 1 runs) through shuffled
// block tables, then attends every sequence's rows in one call.
func pagedAttention(b backend.Backend, ops backend.PagedAttentionOps, rng *rand.Rand, bs int, s layers.AttentionShape, seqs []pagedSeq) ([]float32, []float32) {
	w := s.KVHeads * s.HeadDim
	blocks := 0
	for _, sq := range seqs {
		blocks += (sq.pos0 + sq.rows + bs - 1) / bs
	}
	blocks += 2 // unused blocks between
	pool, kRef, vRef, free := pagedPool(ops, rng, 2, bs, blocks, s)
	var calls []layers.PagedSeq
	var q []float32
	for _, sq := range seqs {
		n := sq.pos0 + sq.rows
		var table []int32
		from := 0
		if sq.share > 0 {
			table = append(table, calls[0].Table[:sq.share/bs]...)
			from = sq.share / bs * bs
			if sq.share%bs != 0 {
				src, dst := int(calls[0].Table[sq.share/bs]), free[0]
				ops.CopyBlock(pool, dst, src)
				copy(kRef[dst*bs*w:(dst+1)*bs*w], kRef[src*bs*w:(src+1)*bs*w])
				copy(vRef[dst*bs*w:(dst+1)*bs*w], vRef[src*bs*w:(src+1)*bs*w])
				table = append(table, int32(dst))
				free = free[1:]
				from = sq.share
			}
		}
		for len(table)*bs < n {
			table, free = append(table, int32(free[0])), free[1:]
		}
		// The sequence's own positions, in two appends (context, then the
		// rows that query).
		for _, span := range [][2]int{{from, sq.pos0}, {max(from, sq.pos0), n}} {
			if span[1] <= span[0] {
				continue
			}
			k, v := rnd(rng, (span[1]-span[0])*w, 1), rnd(rng, (span[1]-span[0])*w, 1)
			layers.PagedWrite(kRef, k, table, bs, w, span[0], span[1]-span[0])
			layers.PagedWrite(vRef, v, table, bs, w, span[0], span[1]-span[0])
			ops.PagedAppend(pool, 1, upload(b, k), upload(b, v), table, span[0], span[1]-span[0])
		}
		calls = append(calls, layers.PagedSeq{Table: table, Pos0: sq.pos0, Rows: sq.rows})
		q = append(q, rnd(rng, sq.rows*s.Heads*s.HeadDim, 1)...)
	}
	want := make([]float32, len(q))
	layers.PagedAttention(want, q, kRef, vRef, calls, bs, s)
	out := b.NewBuffer(len(q))
	ops.PagedAttention(out, upload(b, q), pool, 1, calls, s)
	return read(b, out), want
}

// pagedAppendRoPE fills a pool (layer 0 runs) with every sequence's context
// by PagedAppend, then rotates and appends the rows that query, all
// sequences in one PagedAppendRoPE call, and attends them. Where some
// sequence runs several rows it reads q and k back between the two calls
// and returns them and the attention's output. Where every sequence runs
// one row (decode: a backend may move the append into the attention, q
// and k then left unrotated in memory) it returns the attention's output
// only, of that step and of a second one a position on, which reads the
// keys the first appended.
func pagedAppendRoPE(b backend.Backend, ops backend.PagedAttentionOps, rng *rand.Rand, bs int, s layers.AttentionShape, r *layers.RoPE, seqs []pagedSeq) ([]float32, []float32) {
	return pagedAppendRoPENorm(b, ops, rng, bs, s, r, seqs, false)
}

// pagedAppendRoPENorm is pagedAppendRoPE, with norm after in-place per-head
// RMSNorms of q and k (Qwen3's q_norm and k_norm, eps 1e-6) before the
// append, as the model queues them.
func pagedAppendRoPENorm(b backend.Backend, ops backend.PagedAttentionOps, rng *rand.Rand, bs int, s layers.AttentionShape, r *layers.RoPE, seqs []pagedSeq, norm bool) ([]float32, []float32) {
	w, qw := s.KVHeads*s.HeadDim, s.Heads*s.HeadDim
	var qn, kn []float32
	var qnb, knb backend.Buffer
	if norm {
		qn, kn = rnd(rng, s.HeadDim, 1), rnd(rng, s.HeadDim, 1)
		qnb, knb = upload(b, qn), upload(b, kn)
	}
	decode := true
	for _, sq := range seqs {
		decode = decode && sq.rows == 1
	}
	steps := 1
	if decode {
		steps = 2
	}
	blocks := 1
	for _, sq := range seqs {
		blocks += (sq.pos0 + sq.rows + steps - 1 + bs - 1) / bs
	}
	pool, kRef, vRef, free := pagedPool(ops, rng, 1, bs, blocks, s)
	var calls []layers.PagedSeq
	for _, sq := range seqs {
		var table []int32
		for len(table)*bs < sq.pos0+sq.rows+steps-1 {
			table, free = append(table, int32(free[0])), free[1:]
		}
		if sq.pos0 > 0 { // the context, rotated already
			kc, vc := rnd(rng, sq.pos0*w, 1), rnd(rng, sq.pos0*w, 1)
			layers.PagedWrite(kRef, kc, table, bs, w, 0, sq.pos0)
			layers.PagedWrite(vRef, vc, table, bs, w, 0, sq.pos0)
			ops.PagedAppend(pool, 0, upload(b, kc), upload(b, vc), table, 0, sq.pos0)
		}
		calls = append(calls, layers.PagedSeq{Table: table, Pos0: sq.pos0, Rows: sq.rows})
	}
	var got, want []float32
	for step := range steps {
		if step > 0 {
			for i := range calls {
				calls[i].Pos0++
			}
		}
		var q, k, v []float32
		for _, sq := range calls {
			q = append(q, rnd(rng, sq.Rows*qw, 1)...)
			k = append(k, rnd(rng, sq.Rows*w, 1)...)
			v = append(v, rnd(rng, sq.Rows*w, 1)...)
		}
		qb, kb, vb := upload(b, q), upload(b, k), upload(b, v)
		if norm {
			layers.RMSNorm(q, q, qn, 1e-6)
			layers.RMSNorm(k, k, kn, 1e-6)
			b.RMSNorm(qb, qb, qnb, 1e-6)
			b.RMSNorm(kb, kb, knb, 1e-6)
		}
		row := 0
		for _, sq := range calls {
			layers.ApplyRoPE(q[row*qw:(row+sq.Rows)*qw], sq.Rows, s.Heads, s.HeadDim, 0, sq.Pos0, r, false)
			layers.ApplyRoPE(k[row*w:(row+sq.Rows)*w], sq.Rows, s.KVHeads, s.HeadDim, 0, sq.Pos0, r, false)
			layers.PagedWrite(kRef, k[row*w:], sq.Table, bs, w, sq.Pos0, sq.Rows)
			layers.PagedWrite(vRef, v[row*w:], sq.Table, bs, w, sq.Pos0, sq.Rows)
			row += sq.Rows
		}
		att := make([]float32, len(q))
		layers.PagedAttention(att, q, kRef, vRef, calls, bs, s)
		out := b.NewBuffer(len(q))
		ops.PagedAppendRoPE(pool, 0, qb, kb, vb, calls, s.Heads, r)
		if !decode {
			got = append(append(got, read(b, qb)...), read(b, kb)...)
			want = append(append(want, q...), k...)
		}
		ops.PagedAttention(out, qb, pool, 0, calls, s)
		got, want = append(got, read(b, out)...), append(want, att...)
	}
	return got, want
}
