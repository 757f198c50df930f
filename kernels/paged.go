package kernels

import (
	"fmt"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// The paged KV cache (backend.PagedAttentionOps; kernels in paged.cuh,
// reference layers/paged.go). A call's sequences travel in the queue's step
// values (queue.go): per query row its position, the pool row its key and
// value go to and where its block table is, then the tables, so that the
// launches of a step name only offsets (consecutive steps of the same
// batch shape queue the same launches) and no table is copied with a
// synchronous transfer. The append and the attention of a layer describe
// the same rows, and every layer of a step the same: the description is
// placed once a queue and found again (pagedSlot).

var _ backend.PagedAttentionOps = (*Backend)(nil)

// pagedPool is a BlockPool on the device: one allocation of [layer][keys,
// values][Blocks*BlockSize rows][KVHeads*HeadDim] float32 values.
type pagedPool struct {
	shape backend.PagedShape
	a     *allocation
	plane int // floats of a layer's keys (or values)
}

func (p *pagedPool) Shape() backend.PagedShape { return p.shape }
func (p *pagedPool) Bytes() int64              { return 2 * int64(p.shape.Layers) * int64(p.plane) * 4 }

// planes are the device addresses of layer's keys and values.
func (p *pagedPool) planes(layer int) (k, v uint64) {
	k = p.a.ptr + uint64(2*layer)*uint64(p.plane)*4
	return k, k + uint64(p.plane)*4
}

// pagedMaxHeadDim is the largest head paged_attn_any takes (8 channels a
// lane of a warp).
const pagedMaxHeadDim = 256

// pagedGMax is the most query heads a block of paged_attn weighs each key
// for (PGA_GMAX in paged.cuh); more heads a kv head go to several blocks.
const pagedGMax = 8

// pagedWarps is paged_attn's warps a block (PGA_WARPS in paged.cuh).
const pagedWarps = 4

// pagedRound is the granularity of the keys a paged_attn launch covers:
// the longest sequence's positions are rounded up to it, so that
// consecutive decode steps queue the same launch (and replay one graph)
// for this many positions.
const pagedRound = 64

// pagedMinKeys is the fewest keys a split of paged_attn takes, and its
// keys a multiple of it: a round of the block's warps (PGA_WARPS warps, 4
// keys in flight each at up to 4 query heads a block), so that its warps
// take as many rounds.
const pagedMinKeys = 16

// pagedWaves is the blocks a multiprocessor paged_attn's splits aim at: a
// few at once (4 fit at 128 registers a thread), so that every
// multiprocessor has keys to read and the last blocks leave a short tail.
const pagedWaves = 4

// pagedMaxSplits bounds the splits of a launch (the merge's loops).
const pagedMaxSplits = 64

// pagedState is where the queue's step values hold the rows of the last
// paged call (Backend.paged, guarded by qmu), and the device array that
// takes a description too large for them.
type pagedState struct {
	at  int     // slot of the last description placed (0: none)
	enc []int32 // scratch for the description being built

	// What enc[:encLen] describes (pagedEncode), so that the calls of a
	// step that describe the same rows (every layer's append and
	// attention) skip the checks and the encoding: the pool, each
	// sequence's first position, rows and blocks (their tables are the
	// description's tail), and the rows in all (encPool nil: nothing).
	encPool *pagedPool
	encSeqs []pagedHead
	encLen  int
	encRows int

	big    *allocation // descriptions past pagedBigSlots (bigCap ints; grown under partMu)
	bigCap int
	bigEnc []int32 // what big holds
}

// pagedBigSlots is the longest description placed in the step values
// (which hold dynSlots, a step's token ids too); a longer one (hundreds of
// long sequences) goes to a device array of its own, copied there once a
// step, in stream order.
const pagedBigSlots = dynSlots / 2

// pagedSlots is the length of seqs' description (pagedEncode).
func pagedSlots(seqs []layers.PagedSeq) int {
	n := 0
	for _, sq := range seqs {
		n += 3*max(sq.Rows, 0) + len(sq.Table)
	}
	return n
}

// pagedBig makes the device array hold n values at least, where n is past
// pagedBigSlots. qmu must not be held (alloc takes it).
func (b *Backend) pagedBig(n int) error {
	if n <= pagedBigSlots {
		return nil
	}
	b.partMu.Lock()
	defer b.partMu.Unlock()
	if b.paged.bigCap >= n {
		return nil
	}
	a, err := b.alloc(4 * n)
	if err != nil {
		return fmt.Errorf("kernels: paged block tables of %d values: %w", n, err)
	}
	b.qmu.Lock()
	b.paged.big, b.paged.bigCap, b.paged.bigEnc = a, n, nil
	b.qmu.Unlock()
	return nil
}

// NewBlockPool allocates the pool on the device, zeroed.
func (b *Backend) NewBlockPool(s backend.PagedShape) (backend.BlockPool, error) {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.BlockSize <= 0 || s.Blocks <= 0 {
		return nil, fmt.Errorf("kernels: bad block pool shape %+v", s)
	}
	if s.HeadDim > pagedMaxHeadDim {
		return nil, fmt.Errorf("kernels: block pool of head size %d: paged attention takes heads of at most %d", s.HeadDim, pagedMaxHeadDim)
	}
	plane := s.Blocks * s.BlockSize * s.KVHeads * s.HeadDim
	if int64(plane) >= 1<<40 || int64(s.Blocks)*int64(s.BlockSize) >= 1<<31 {
		return nil, fmt.Errorf("kernels: block pool %+v is too large", s)
	}
	a, err := b.alloc(2 * s.Layers * plane * 4)
	if err != nil {
		return nil, fmt.Errorf("kernels: block pool of %d blocks: %w", s.Blocks, err)
	}
	return &pagedPool{shape: s, a: a, plane: plane}, nil
}

// pagedEncode builds the description of seqs' rows in b.paged.enc (qmu
// held): per row its position, its pool row and the slot of its table
// (from the description's start), then the tables. It checks every table
// against the pool.
func (b *Backend) pagedEncode(p *pagedPool, seqs []layers.PagedSeq) (rows int, err error) {
	if b.pagedEncoded(p, seqs) {
		b.paged.enc = b.paged.enc[:b.paged.encLen] // less what a PagedAttention appended
		return b.paged.encRows, nil
	}
	bs := p.shape.BlockSize
	for i, sq := range seqs {
		if sq.Pos0 < 0 || sq.Rows < 0 {
			return 0, fmt.Errorf("kernels: paged sequence %d at positions [%d, %d)", i, sq.Pos0, sq.Pos0+sq.Rows)
		}
		if need := (sq.Pos0 + sq.Rows + bs - 1) / bs; need > len(sq.Table) {
			return 0, fmt.Errorf("kernels: paged sequence %d at positions [%d, %d) past a table of %d blocks of %d", i, sq.Pos0, sq.Pos0+sq.Rows, len(sq.Table), bs)
		}
		for _, blk := range sq.Table {
			if blk < 0 || int(blk) >= p.shape.Blocks {
				return 0, fmt.Errorf("kernels: paged sequence %d: block %d of its table is outside the pool's %d", i, blk, p.shape.Blocks)
			}
		}
		rows += sq.Rows
	}
	enc := b.paged.enc[:0]
	tab := 3 * rows
	for _, sq := range seqs {
		for j := range sq.Rows {
			pos := sq.Pos0 + j
			enc = append(enc, int32(pos), int32(layers.PagedRow(sq.Table, bs, pos)), int32(tab))
		}
		tab += len(sq.Table)
	}
	heads := b.paged.encSeqs[:0]
	for _, sq := range seqs {
		enc = append(enc, sq.Table...)
		heads = append(heads, pagedHead{pos0: sq.Pos0, rows: sq.Rows, blocks: len(sq.Table)})
	}
	b.paged.enc = enc
	b.paged.encPool, b.paged.encSeqs, b.paged.encLen, b.paged.encRows = p, heads, len(enc), rows
	return rows, nil
}

// equalInt32 is slices.Equal of a and b compared as bytes (the runtime's
// vectorized comparison: descriptions run to thousands of values, compared
// several times a layer).
func equalInt32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*len(a))) == string(unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b)))
}

// pagedHead is what pagedEncode keeps of a sequence besides its table.
type pagedHead struct{ pos0, rows, blocks int }

// pagedEncoded reports whether b.paged.enc[:encLen] describes seqs in p
// already: the same positions, rows and tables (compared by value, so
// that a table changed in place, copy-on-write, is encoded again). qmu is
// held.
func (b *Backend) pagedEncoded(p *pagedPool, seqs []layers.PagedSeq) bool {
	ps := &b.paged
	if ps.encPool != p || len(ps.encSeqs) != len(seqs) || len(ps.enc) < ps.encLen {
		return false
	}
	tab := 3 * ps.encRows
	for i, sq := range seqs {
		h := ps.encSeqs[i]
		if sq.Pos0 != h.pos0 || sq.Rows != h.rows || len(sq.Table) != h.blocks || !equalInt32(sq.Table, ps.enc[tab:tab+h.blocks]) {
			return false
		}
		tab += h.blocks
	}
	return true
}

// pagedSlot places b.paged.enc in the queue's step values, or finds it
// there already (the same rows, an earlier layer's or the append's), and
// returns the array and the slot the kernels read it from (qmu held). A
// description past pagedBigSlots goes to the device array pagedBig made
// instead, after what is queued (which may read its previous contents).
func (b *Backend) pagedSlot() (base uint64, at int, err error) {
	q, enc := &b.q, b.paged.enc
	if len(enc) > pagedBigSlots {
		big := b.paged.big
		if big == nil || b.paged.bigCap < len(enc) {
			return 0, 0, fmt.Errorf("kernels: paged block tables of %d values without their device array", len(enc))
		}
		// Held already when it begins what the array holds (an append's
		// rows, the attention's with its lists after them).
		if held := b.paged.bigEnc; len(held) < len(enc) || !equalInt32(held[:len(enc)], enc) {
			b.d.onContext(b.ctx, func() {
				b.flushLocked()
				b.setErr(b.d.check("cuMemcpyHtoDAsync (block tables)",
					b.d.cuMemcpyHtoDAsync(big.ptr, unsafe.Pointer(&enc[0]), uintptr(4*len(enc)), b.stream)))
			})
			b.paged.bigEnc = append(b.paged.bigEnc[:0], enc...)
		}
		b.q.keep = append(b.q.keep, big)
		return big.ptr, 0, nil
	}
	if at := b.paged.at; at > 0 && at+len(enc) <= len(q.dyn) && equalInt32(q.dyn[at:at+len(enc)], enc) {
		return b.dyn.ptr, at, nil
	}
	at = q.addIDs(enc)
	if at < 0 {
		b.d.onContext(b.ctx, b.flushLocked)
		if at = q.addIDs(enc); at < 0 {
			return 0, 0, fmt.Errorf("kernels: paged call of %d rows and tables takes %d step values, more than %d", len(enc)/3, len(enc), dynSlots-1)
		}
	}
	b.paged.at = at
	return b.dyn.ptr, at, nil
}

// PagedAppend writes k and v through the block table (paged_append).
func (b *Backend) PagedAppend(pool backend.BlockPool, layer int, k, v backend.Buffer, table []int32, pos0, m int) {
	b.pagedAppend(pool.(*pagedPool), layer, nil, k, v, []layers.PagedSeq{{Table: table, Pos0: pos0, Rows: m}}, 0, nil)
}

// PagedAppendRoPE rotates q and k and appends every sequence's rows in one
// launch (paged_append): the angles are rope_dyn's.
func (b *Backend) PagedAppendRoPE(pool backend.BlockPool, layer int, q, k, v backend.Buffer, seqs []layers.PagedSeq, heads int, r *layers.RoPE) {
	b.pagedAppend(pool.(*pagedPool), layer, q, k, v, seqs, heads, r)
}

func (b *Backend) pagedAppend(p *pagedPool, layer int, q, k, v backend.Buffer, seqs []layers.PagedSeq, heads int, r *layers.RoPE) {
	s := p.shape
	if layer < 0 || layer >= s.Layers {
		b.setErr(fmt.Errorf("kernels: paged append to layer %d of a pool of %d", layer, s.Layers))
		return
	}
	half, scale, inter := 0, float32(1), 0
	var freqs *allocation
	if r != nil {
		half, scale, inter = len(r.InvFreq), r.Scale, boolInt(r.Interleaved)
		if 2*half > s.HeadDim {
			b.setErr(fmt.Errorf("kernels: paged append: RoPE of %d channels on heads of %d", 2*half, s.HeadDim))
			return
		}
		freqs = b.ropeTable(r)
	}
	fn := b.function("paged_append")
	if fn == 0 {
		return
	}
	if err := b.pagedBig(pagedSlots(seqs)); err != nil {
		b.setErr(err)
		return
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	rows, err := b.pagedEncode(p, seqs)
	if err == nil {
		w := s.KVHeads * s.HeadDim
		switch {
		case k.Len() < rows*w || v.Len() < rows*w:
			err = fmt.Errorf("kernels: paged append of %d rows of %d from buffers of %d and %d", rows, w, k.Len(), v.Len())
		case q != nil && q.Len() < rows*heads*s.HeadDim:
			err = fmt.Errorf("kernels: paged append: q of %d values for %d rows of %d heads of %d", q.Len(), rows, heads, s.HeadDim)
		}
	}
	if err != nil {
		b.setErr(err)
		return
	}
	if rows == 0 {
		return
	}
	base, at, err := b.pagedSlot()
	if err != nil {
		b.setErr(err)
		return
	}
	kp, vp := p.planes(layer)
	var qp, fp uint64
	if q != nil && r != nil {
		qp = ptr(q)
	}
	if freqs != nil {
		fp = freqs.ptr
	}
	b.q.keep = append(b.q.keep, p, q, k, v, freqs)
	// In-place per-head RMSNorms of q (when rotated here) and k queued
	// before (Qwen3's q_norm and k_norm) move into the launch, one epsilon
	// for both (takeNorm).
	var qnw, knw uint64
	var eps float32
	if qp != 0 {
		qnw, eps, _ = b.takeNorm(spanOf(q.(*Buffer)), s.HeadDim, rows*heads, 0, false)
	}
	knw, keps, _ := b.takeNorm(spanOf(k.(*Buffer)), s.HeadDim, rows*s.KVHeads, eps, qnw != 0)
	if qnw == 0 {
		eps = keps
	}
	o := op{kind: opKernel, name: "paged_append", fn: fn, grid: [3]uint32{uint32(rows), 1, 1}, block: 256, pdl: pdlKernel("paged_append")}
	o.setParams(qp, ptr(k), ptr(v), kp, vp, base, at, heads, s.KVHeads, s.HeadDim, fp, half, scale, inter, qnw, knw, eps)
	b.push(o)
}

// pagedSplits picks paged_attn's splits of the keys and the keys a split
// takes for a launch of blocks blocks a split over sequences of at most
// longest positions, rounded up to pagedRound: enough splits that the grid
// holds about pagedWaves blocks a multiprocessor, each of at least
// pagedMinKeys keys, then the fewest that cover the positions at keys
// rounded up to a multiple of pagedMinKeys (548 positions at one sequence
// of 8 kv heads on 132 multiprocessors: 36 splits of 16 keys; at 32
// sequences, 3 of 192).
func (b *Backend) pagedSplits(blocks, longest int) (splits, keys int) {
	span := (max(longest, 1) + pagedRound - 1) / pagedRound * pagedRound
	if f := b.force.pagedKeys; f > 0 {
		return (span + f - 1) / f, f
	}
	splits = min((pagedWaves*b.sms+blocks-1)/blocks, pagedMaxSplits, span/pagedMinKeys)
	splits = max(splits, 1)
	keys = ((span+splits-1)/splits + pagedMinKeys - 1) / pagedMinKeys * pagedMinKeys
	return (span + keys - 1) / keys, keys
}

// pagedTileRows is the most rows of paged_prefill's tile (APF_ROWS in
// decode.cuh); sequences that run attnPrefillRows rows or more take it.
const pagedTileRows = 64

// pagedPlan splits seqs' rows between paged_prefill, in tiles of up to
// pagedTileRows consecutive rows of a sequence running attnPrefillRows or
// more (heads of 64 and 128; first row, rows), and paged_attn, the rest
// (their row indices; all of them, list nil, when no tile is made), and
// returns the longest sequence those rows belong to.
func (b *Backend) pagedPlan(seqs []layers.PagedSeq, hd int) (list, tiles []int32, longest int) {
	tiled := (hd == 64 || hd == 128) && !b.force.pagedNoTiles
	row := 0
	for _, sq := range seqs {
		if tiled && sq.Rows >= attnPrefillRows {
			for i := 0; i < sq.Rows; i += pagedTileRows {
				tiles = append(tiles, int32(row+i), int32(min(pagedTileRows, sq.Rows-i)))
			}
		} else {
			for i := range sq.Rows {
				list = append(list, int32(row+i))
			}
			if sq.Rows > 0 {
				longest = max(longest, sq.Pos0+sq.Rows)
			}
		}
		row += sq.Rows
	}
	if len(tiles) == 0 {
		list = nil
	}
	return list, tiles, longest
}

// PagedAttention attends every sequence's rows over its keys: the rows of
// prompt chunks in tiles that share each key they load (paged_prefill), the
// others in one launch of paged_attn (split over the keys where the rows
// and heads alone leave the GPU short of blocks, the last split of a row to
// finish merging them).
func (b *Backend) PagedAttention(out, q backend.Buffer, pool backend.BlockPool, layer int, seqs []layers.PagedSeq, s layers.AttentionShape) {
	p := pool.(*pagedPool)
	ps := p.shape
	switch {
	case layer < 0 || layer >= ps.Layers:
		b.setErr(fmt.Errorf("kernels: paged attention of layer %d of a pool of %d", layer, ps.Layers))
		return
	case s.HeadDim != ps.HeadDim || s.KVHeads != ps.KVHeads || s.Heads <= 0 || s.Heads%s.KVHeads != 0:
		b.setErr(fmt.Errorf("kernels: paged attention of %d heads, %d kv heads of %d over a pool of %d kv heads of %d",
			s.Heads, s.KVHeads, s.HeadDim, ps.KVHeads, ps.HeadDim))
		return
	}
	G := s.Heads / s.KVHeads
	hgroups := 1
	for G/hgroups > pagedGMax || G%hgroups != 0 {
		hgroups++
	}
	rows := 0
	decode := true // every row its sequence's only one
	for _, sq := range seqs {
		rows += sq.Rows
		decode = decode && sq.Rows <= 1
	}
	if rows == 0 {
		return
	}
	if n := rows * s.Heads * s.HeadDim; out.Len() < n || q.Len() < n {
		b.setErr(fmt.Errorf("kernels: paged attention of %d rows of %d heads of %d: out %d, q %d values", rows, s.Heads, s.HeadDim, out.Len(), q.Len()))
		return
	}
	list, tiles, longest := b.pagedPlan(seqs, s.HeadDim)
	attnRows := rows
	if list != nil || len(tiles) > 0 {
		attnRows = len(list)
	}
	blocks := attnRows * s.KVHeads * hgroups
	splits, keys := 1, 0
	var part, ticket *allocation
	if attnRows > 0 {
		splits, keys = b.pagedSplits(blocks, longest)
	}
	if splits > 1 {
		var err error
		if part, ticket, err = b.attnScratch(rows*s.Heads*splits*(s.HeadDim+2), blocks); err != nil {
			b.setErr(err)
			return
		}
	}
	name := "paged_attn_any"
	if s.HeadDim == 64 || s.HeadDim == 128 {
		name = fmt.Sprintf("paged_attn_%d", s.HeadDim)
		if G/hgroups <= 4 {
			name += "_g4"
		}
	}
	prefill := fmt.Sprintf("paged_prefill_%d", s.HeadDim)
	fn, fused := b.function(name), b.function(name+"_rope")
	if fn == 0 || fused == 0 || len(tiles) > 0 && b.function(prefill) == 0 {
		return
	}
	if err := b.pagedBig(pagedSlots(seqs) + len(list) + len(tiles)); err != nil {
		b.setErr(err)
		return
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if _, err := b.pagedEncode(p, seqs); err != nil {
		b.setErr(err)
		return
	}
	// The lists follow the description (its slots from its start).
	listAt, tilesAt := -1, len(b.paged.enc)+len(list)
	if list != nil {
		listAt = len(b.paged.enc)
	}
	b.paged.enc = append(append(b.paged.enc, list...), tiles...)
	base, at, err := b.pagedSlot()
	if err != nil {
		b.setErr(err)
		return
	}
	kp, vp := p.planes(layer)
	b.q.keep = append(b.q.keep, p, out, q, part, ticket)
	if len(tiles) > 0 {
		o := op{kind: opKernel, name: prefill, fn: b.function(prefill), grid: [3]uint32{uint32(s.Heads), uint32(len(tiles) / 2), 1},
			block: 256, shared: uint32(4 * (3*pagedTileRows*(s.HeadDim+4) + pagedTileRows*(pagedTileRows+4))), pdl: pdlKernel(prefill)}
		o.setParams(ptr(out), ptr(q), kp, vp, base, at, tilesAt, s.Heads, s.KVHeads, s.Scale, s.Window, ps.BlockSize)
		b.push(o)
	}
	if attnRows == 0 {
		return
	}
	var partPtr, ticketPtr uint64
	if part != nil {
		partPtr, ticketPtr = part.ptr, ticket.ptr
	}
	gb := G / hgroups
	o := op{kind: opKernel, name: name, fn: fn, grid: [3]uint32{uint32(blocks), uint32(splits), 1}, block: 32 * pagedWarps,
		shared: uint32(4 * pagedWarps * gb * (s.HeadDim + 4)), pdl: pdlKernel(name)}
	o.setParams(ptr(out), ptr(q), kp, vp, base, at, s.Heads, s.KVHeads, s.HeadDim, hgroups, s.Scale, s.Window,
		ps.BlockSize, keys, partPtr, ticketPtr, listAt)
	if app := b.pagedAppendOf(ptr(q), kp, vp, base, at, rows, s); decode && app != nil && !b.force.pagedUnfused {
		// The append (and its RoPE) queued just before, of these rows:
		// it moves into the launch (paged_attn_*_rope), q and k left
		// unrotated in memory.
		o.name, o.fn, o.pdl = name+"_rope", fused, pdlKernel(name+"_rope")
		o.shared += uint32(4 * 2 * s.HeadDim)
		o.params = append(o.params, app[1], app[2], app[10], app[11], app[12], app[13], app[14], app[15], app[16])
		for i := range 9 {
			o.offs = append(o.offs, uint16(len(o.params)-9+i))
		}
		b.q.ops = b.q.ops[:len(b.q.ops)-1]
		b.pushed-- // never launched
	}
	b.push(o)
}

// pagedAppendOf returns the parameters of the paged_append queued last
// when it appends (and rotates, q with them where it rotates) the rows
// that a paged attention of q over pool planes kp and vp, described at
// (base, at), runs: q, k, v, kp, vp, base, at, heads, kvHeads, hd, freqs,
// half, scale, interleaved, qnw, knw, eps (the norms it took in); nil
// otherwise. qmu held.
func (b *Backend) pagedAppendOf(q, kp, vp, base uint64, at, rows int, s layers.AttentionShape) []uint64 {
	n := len(b.q.ops)
	if n == 0 {
		return nil
	}
	o := &b.q.ops[n-1]
	if o.kind != opKernel || o.name != "paged_append" || len(o.params) != 17 || int(o.grid[0]) != rows {
		return nil
	}
	p := o.params
	rotates := p[11] != 0
	if rotates && (p[0] != q || int(int32(p[7])) != s.Heads) || p[3] != kp || p[4] != vp || p[5] != base ||
		int(int32(p[6])) != at || int(int32(p[8])) != s.KVHeads || int(int32(p[9])) != s.HeadDim {
		return nil
	}
	return p
}

// CopyBlock copies block src to dst in every layer's keys and values
// (paged_copy).
func (b *Backend) CopyBlock(pool backend.BlockPool, dst, src int) {
	p := pool.(*pagedPool)
	s := p.shape
	if dst < 0 || src < 0 || dst >= s.Blocks || src >= s.Blocks {
		b.setErr(fmt.Errorf("kernels: copy of block %d to %d in a pool of %d", src, dst, s.Blocks))
		return
	}
	if dst == src {
		return
	}
	floats := s.BlockSize * s.KVHeads * s.HeadDim
	fn := b.function("paged_copy")
	if fn == 0 {
		return
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.q.keep = append(b.q.keep, p)
	o := op{kind: opKernel, name: "paged_copy", fn: fn, grid: [3]uint32{uint32(2 * s.Layers), uint32(min((floats+1023)/1024, 16)), 1},
		block: 256, pdl: pdlKernel("paged_copy")}
	o.setParams(p.a.ptr, uint64(p.plane), floats, dst, src)
	b.push(o)
}
