package kernels

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// DeepSeek-V4's operations of layers/dsv4 on the GPU (backend.CompressedAttentionOps), kernels in
// dsv4.cuh (and the indexer's scores and top-k in dsa.cuh). ops_test.go
// holds each to the CPU backend.

var _ backend.CompressedAttentionOps = (*Backend)(nil)

// v4Chunk is V4_CHUNK of dsv4.cuh: key scores in shared memory at a time.
const v4Chunk = 1024

// topkThreads is the block size of topk_select and the tkm_ kernels.
const topkThreads = 1024

// The many-block top-k (tkm_ in dsa.cuh): TKM_CHUNK keys per block, at
// most TKM_MAXB blocks per row, TKM_WS workspace words per row; taken for
// at most tkmRows rows of at least tkmMinKeys keys (decode over long
// contexts), where one block per row leaves the GPU idle.
const (
	tkmChunk   = 2048
	tkmMaxB    = 512
	tkmWS      = 3*2048 + 2*tkmMaxB + 2
	tkmRows    = 4
	tkmMinKeys = 16384
)

// The cluster top-k (tkc_select in dsa.cuh): tkcBlocks blocks per row, the
// row's keys in their shared memory; taken where the many-block passes
// would be, while the keys fit. From tkc16MinKeys keys, clusters of 16
// (tkc_select16) where the GPU runs them: its keys take half the time per
// block, its passes a little more (ncu: 27.1 against 32.5 us at 131072
// keys, 22.6 against 21.3 at 32768).
const (
	tkcBlocks    = 8
	tkc16MinKeys = 65536
)

// tkc16Fits reports whether clusters of 16 tkc_select16 blocks can run on
// this GPU (a non-portable cluster size: Hopper's GPCs hold 16 or more SMs,
// not every GPU's), asked of the driver once. A failed lookup only means no.
func (b *Backend) tkc16Fits() bool {
	b.tkc16Once.Do(func() {
		f, err := b.lookup("tkc_select16")
		if err != nil || b.d.cuOccupancyMaxActiveClusters == nil {
			return
		}
		cfg := launchConfig{grid: [3]uint32{16, 1, 1}, block: [3]uint32{topkThreads, 1, 1}, shared: uint32(b.opsShare()), stream: b.stream}
		var n int32
		b.d.onContext(b.ctx, func() {
			b.tkc16OK = b.d.cuOccupancyMaxActiveClusters(&n, f, unsafe.Pointer(&cfg)) == 0 && n >= 1
		})
	})
	return b.tkc16OK
}

// Top-k paths (Backend.force.topkPath; tests and benchmarks force the others).
const (
	topkAuto     = iota // one cluster per row for a few long rows, else one block per row
	topkMany            // the many-block passes (tkm_) for a few long rows
	topkOneBlock        // one block per row always
)

// topK selects the top-k of rows rows of n scores at sp (topk_select's
// arguments; xp its scratch of 3n words per row): one block per row, or
// for a few long rows a cluster of blocks per row (or, past what their
// shared memory holds, the many-block passes over a workspace the backend
// keeps, zeroed when allocated and cleared again by tkm_emit).
func (b *Backend) topK(sp uint64, n, topk, pos0, rate int, out uint64, ostride int, cp uint64, mode int, xp uint64, rows int) {
	few := rows <= tkmRows && n >= tkmMinKeys && topk >= 1
	if few && b.force.topkPath == topkAuto {
		name, cb := "tkc_select", tkcBlocks
		if n >= tkc16MinKeys && !b.force.tkc8 && b.tkc16Fits() {
			name, cb = "tkc_select16", 16
		}
		// tkc_select's shared memory: five arrays of 2048 bins and its keys.
		if share := 4 * (5*2048 + (n+cb-1)/cb); share <= b.opsShare() {
			b.launch(name, [3]int{cb, rows, 1}, topkThreads, share, sp, n, topk, pos0, rate, out, ostride, cp, mode, xp)
			return
		}
	}
	if b.force.topkPath == topkOneBlock || !few || n > tkmChunk*tkmMaxB {
		staged, shared := 0, 0
		if 4*n <= b.opsShare() {
			staged, shared = 1, 4*n
		}
		b.launch("topk_select", [3]int{rows, 1, 1}, topkThreads, shared, sp, n, topk, pos0, rate, out, ostride, cp, mode, xp, staged)
		return
	}
	if err := b.grow(&b.tkmWS, &b.tkmCap, tkmRows*tkmWS); err != nil {
		b.setErr(err)
		return
	}
	ws := b.tkmWS.ptr
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, b.tkmWS)
	b.qmu.Unlock()
	grid := [3]int{(n + tkmChunk - 1) / tkmChunk, rows, 1}
	for pass := range 3 {
		b.launch("tkm_hist", grid, topkThreads, 0, sp, n, topk, ws, pass)
	}
	b.launch("tkm_count", grid, topkThreads, 0, sp, n, topk, pos0, rate, ws)
	b.launch("tkm_emit", grid, topkThreads, 0, sp, n, topk, pos0, rate, out, ostride, cp, mode, xp, ws)
}

// CompressKV pools, normalizes and rotates compressed entries, one block per entry.
func (b *Backend) CompressKV(dst, kv, gate, ape, norm backend.Buffer, a dsv4.CompressArgs) {
	if a.Entries <= 0 {
		return
	}
	if 4*a.Width > b.opsShare() {
		b.setErr(fmt.Errorf("kernels: compressor width %d exceeds this GPU's shared memory", a.Width))
		return
	}
	var tab *allocation
	var freqs uint64
	half, inter, rscale := 0, 0, float32(1)
	if a.RoPE != nil {
		if a.RoPE.Dim() > a.Width {
			b.setErr(fmt.Errorf("kernels: compressor rotary dim %d exceeds its width %d", a.RoPE.Dim(), a.Width))
			return
		}
		tab = b.ropeTable(a.RoPE)
		freqs, half, rscale, inter = tab.ptr, len(a.RoPE.InvFreq), a.RoPE.Scale, boolInt(a.RoPE.Interleaved)
	}
	// Its effects are known, so that the fusion pass moves the indexer's
	// query projection, queued after a closing window's compressions, to
	// the query projection it joins in every other step (pass.go).
	fx := fxOf([]*Buffer{dst.(*Buffer)}, kv.(*Buffer), gate.(*Buffer), ape.(*Buffer), norm.(*Buffer))
	b.enqueueFx(fx, "v4_compress", [3]int{a.Entries, 1, 1}, 256, 4*a.Width, ptr(dst), ptr(kv), ptr(gate), ptr(ape), ptr(norm),
		a.Rate, a.Width, boolInt(a.Overlap), boolInt(a.Prev), a.Pos0, a.Eps, freqs, half, rscale, inter)
	runtime.KeepAlive(tab)
}

// CompressedIndexTopK scores every compressed entry for each query (scoreKeys, as
// DSA's indexer), then selects each query's entries with the exact top-k
// (torch's ties; see dsa.cuh).
func (b *Backend) CompressedIndexTopK(idx, q, keys, weights backend.Buffer, a dsv4.IndexArgs) {
	if a.M <= 0 {
		return
	}
	if a.Rate <= 0 {
		b.setErr(fmt.Errorf("kernels: indexer compression rate %d", a.Rate))
		return
	}
	b.selectTopK(idx, 1, nil, a.M, a.Entries, a.TopK, a.TopK, a.Pos0, a.Rate, func(scores uint64) {
		b.scoreKeys(scores, q, keys, weights, a.M, a.Entries, a.Heads, a.Dim, a.Pos0, a.Rate, a.Scale, false)
	})
}

// selectTopK scores rows queries over n keys with score (which writes
// [rows, n] floats at the address it gets) and selects each row's top-k
// into out: mode 1 writes float-coded indices, -1 padded, rows ostride
// apart; mode 0 writes int32 indices and cnt the counts. Query i sees keys
// below min((pos0+i+1)/rate, n). The scores and the fallback's scratch are
// the backend's, kept between calls (topkScratch).
func (b *Backend) selectTopK(out backend.Buffer, mode int, cnt *allocation, rows, n, topk, ostride, pos0, rate int, score func(scores uint64)) {
	var sp, xp uint64
	if n > 0 {
		scores, scratch, err := b.topkScratch(rows * n)
		if err != nil {
			b.setErr(err)
			return
		}
		sp, xp = scores.ptr, scratch.ptr
		// The queue keeps them alive until it launches: a collection before
		// then would free memory its launches still write.
		b.qmu.Lock()
		b.q.keep = append(b.q.keep, scores, scratch)
		b.qmu.Unlock()
		score(sp)
	}
	var cp uint64
	if cnt != nil {
		cp = cnt.ptr
	}
	b.topK(sp, n, topk, pos0, rate, ptr(out), ostride, cp, mode, xp, rows)
}

// topkScratch holds selectTopK's scores ([rows, n] floats) and topk_select's
// scratch (3 words a score) between calls. A decode step's CSA layers each
// score every compressed entry: allocating both per call cost two
// cuMemAlloc and two memsets a layer (and, once collected, two cuMemFree,
// each of which waits for the device), about 40 of each a DeepSeek-V4
// token, and moved the addresses that the step's launches take, so that
// no two steps queued the same work. Every launch that uses them writes
// what it reads first (the scores: every key of every row, -inf past the
// visible ones; the top-k zeroes its flags), so nothing needs them zeroed.
type topkScratch struct {
	scores, scratch *allocation
	cap             int // scores they hold
}

// topkScratch returns scores for at least n scores and the top-k scratch
// beside them: the kept pair, grown to twice its size or n when short (so
// that a context's growth reallocates them rarely), or up to dsaKeepScores
// scores; larger calls (long prefills) allocate their own. A pair still
// queued when replaced stays alive through the queue's keep.
func (b *Backend) topkScratch(n int) (scores, scratch *allocation, err error) {
	b.partMu.Lock()
	defer b.partMu.Unlock()
	t := &b.topk
	if n > t.cap {
		c := max(n, min(2*t.cap, dsaKeepScores))
		if scores, err = b.alloc(4 * c); err != nil {
			return nil, nil, err
		}
		if scratch, err = b.alloc(4 * 3 * c); err != nil {
			return nil, nil, err
		}
		if c > dsaKeepScores {
			return scores, scratch, nil
		}
		t.scores, t.scratch, t.cap = scores, scratch, c
	}
	return t.scores, t.scratch, nil
}

// CompressedAttention attends with sinks, one block per (head, query) (dsv4.cuh).
func (b *Backend) CompressedAttention(out, q, local, comp, idx, sinks backend.Buffer, a dsv4.AttnArgs) {
	if a.M <= 0 {
		return
	}
	shared := 4*(v4Chunk+(a.Dim+3)&^3) + 8*v4Chunk // scores, the accumulator, the keys' row addresses
	if shared > b.opsShare() {
		b.setErr(fmt.Errorf("kernels: compressed attention head dim %d exceeds this GPU's shared memory", a.Dim))
		return
	}
	if b.v4AttentionMMA(out, q, local, comp, idx, sinks, a) {
		return
	}
	name := "v4_attention"
	if a.Dim%4 == 0 && (ptr(local)|optPtr(comp))%16 == 0 {
		name = "v4_attention4" // float4 loads of the value rows
	}
	b.launch(name, [3]int{a.Heads, a.M, 1}, 128, shared, ptr(out), ptr(q), ptr(local), optPtr(comp), optPtr(idx),
		ptr(sinks), a.Heads, a.Dim, a.Pos0, a.Lo, a.Window, a.Rate, a.TopK, a.Entries, a.Scale)
}

// v4AttentionMMA queues v4_attention_mma (dsa.cuh: dsa_attend_mma's body
// over V4's rows, 16 heads a block, the keys split over blocks as for DSA,
// dsa_attend_combine merging the splits) where the head dim allows it (a
// multiple of 64 up to 512, 16-byte aligned rows); false if it does not.
func (b *Backend) v4AttentionMMA(out, q, local, comp, idx, sinks backend.Buffer, a dsv4.AttnArgs) bool {
	if !b.attendMMAFits(a.Dim, 0) || a.Dim > 512 || (ptr(out)|ptr(q)|ptr(local)|optPtr(comp))%16 != 0 {
		return false
	}
	splits, per := b.dsaSplits(a.MaxKeys(), a.M, a.Heads, 1)
	var part uint64
	var keep []any
	if splits > 1 {
		pa, _, err := b.attnScratch(a.M*splits*a.Heads*(a.Dim+2), 0)
		if err != nil {
			b.setErr(err)
			return true
		}
		part, keep = pa.ptr, []any{pa}
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, keep...)
	b.q.keep = append(b.q.keep, out, q, local, comp, idx, sinks)
	b.qmu.Unlock()
	groups := (a.Heads + dsaGroup - 1) / dsaGroup
	nw := b.attendMMAWarps(a.Dim)
	b.launch(attendMMAKernel("v4_attention_mma", nw), [3]int{splits, groups, a.M}, nw*32, attendMMAShare(a.Dim, 0, nw), ptr(out), part,
		ptr(q), ptr(local), optPtr(comp), optPtr(idx), ptr(sinks), a.Heads, a.Dim, a.Pos0, a.Lo, a.Window, a.Rate,
		a.TopK, a.Entries, per, a.Scale)
	if splits > 1 {
		b.launch("dsa_attend_combine", [3]int{a.Heads, a.M, 1}, 128, 0, ptr(out), part, a.M, a.Heads, a.Dim, splits)
	}
	return true
}

// Transpose swaps the outer axes of [a, b, w].
func (b *Backend) Transpose(dst, src backend.Buffer, a, bb, w int) {
	if a*bb*w <= 0 {
		return
	}
	fx := fxOf([]*Buffer{dst.(*Buffer)}, src.(*Buffer))
	b.enqueueFx(fx, "v4_transpose", grid1(a*bb*w, 256), 256, 0, ptr(dst), ptr(src), a, bb, w)
}

// GroupedMatMul computes group j of every row of dst as group j of x times
// ws[j]ᵀ. One row: a matmul a group on its slice of x, which the fusion
// pass joins into launches of three strided groups (joinStrided). More
// rows: the groups are transposed to the front ([m, G, w] -> [G, m, w]),
// multiplied as m-row matmuls and transposed back.
func (b *Backend) GroupedMatMul(dst, x backend.Buffer, ws []backend.Weight, m int) {
	G, rows, cols := len(ws), ws[0].Rows(), ws[0].Cols()
	if m == 1 {
		for j, w := range ws {
			b.MatMul(b.View(dst, j*rows, rows), b.View(x, j*cols, cols), w, 1)
		}
		return
	}
	gs := &b.grouped
	if err := b.grow(&gs.x, &gs.xCap, m*G*cols); err != nil {
		b.setErr(err)
		return
	}
	if err := b.grow(&gs.y, &gs.yCap, m*G*rows); err != nil {
		b.setErr(err)
		return
	}
	gx := &Buffer{a: gs.x, ptr: gs.x.ptr, n: m * G * cols}
	gy := &Buffer{a: gs.y, ptr: gs.y.ptr, n: m * G * rows}
	b.Transpose(gx, x, m, G, cols)
	for j, w := range ws {
		b.MatMul(b.View(gy, j*m*rows, m*rows), b.View(gx, j*m*cols, m*cols), w, m)
	}
	b.Transpose(dst, gy, G, m, rows)
}

// groupedScratch holds GroupedMatMul's transposed input and output, kept
// between calls (one stream: queued work runs in order).
type groupedScratch struct {
	x, y       *allocation
	xCap, yCap int
}

// GatherRows copies rows of src into dst (MoE dispatch).
func (b *Backend) GatherRows(dst, src backend.Buffer, rows []int32, w int) {
	b.gatherRows(dst, src, rows, w)
}

// ScatterAddRows adds scaled rows of src into rows of dst (MoE combine).
func (b *Backend) ScatterAddRows(dst, src backend.Buffer, rows []int32, scale []float32, w int) {
	b.scatterAddRows(dst, src, rows, scale, w)
}

// gatherRows copies rows[i] of src to row i of dst, up to 256 rows a launch
// with the ids in the kernel's parameters.
func (b *Backend) gatherRows(dst, src backend.Buffer, rows []int32, w int) {
	if w <= 0 {
		return
	}
	const idBlock = 256
	for lo := 0; lo < len(rows); lo += idBlock {
		blk := make([]int32, idBlock)
		n := copy(blk, rows[lo:])
		b.launch("rows_gather", [3]int{(w + 255) / 256, n, 1}, 256, 0, ptr(dst)+uint64(4*lo*w), ptr(src), blk, w)
	}
}

// scatterAddRows adds scale[i] * row i of src to row rows[i] of dst, up to
// 128 rows a launch (rows and scales in the parameters), in order.
func (b *Backend) scatterAddRows(dst, src backend.Buffer, rows []int32, scale []float32, w int) {
	if w <= 0 {
		return
	}
	const rowBlock = 128
	for lo := 0; lo < len(rows); lo += rowBlock {
		blk := make([]int32, 2*rowBlock)
		n := copy(blk, rows[lo:min(lo+rowBlock, len(rows))])
		for i, s := range scale[lo : lo+n] {
			blk[rowBlock+i] = int32(math.Float32bits(s))
		}
		b.launch("rows_scatter_add", [3]int{(w + 255) / 256, 1, 1}, 256, 0, ptr(dst), ptr(src)+uint64(4*lo*w), blk, n, w)
	}
}
