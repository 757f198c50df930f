package kernels

import (
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
)

// DeepSeek Sparse Attention and the MLA steps on the GPU (backend.SparseMLAOps), kernels
// in dsa.cuh. ops_test.go holds each to the CPU backend.

var _ backend.SparseMLAOps = (*Backend)(nil)

// dsaIndices is the GPU's backend.Indices: each query's selected token indices
// (int32 [rows, k], increasing) and their counts, on the device.
type dsaIndices struct {
	shape   dsa.IndexerShape
	rows, k int
	sel     *allocation // int32 [rows, k]
	cnt     *allocation // int32 [rows]
	selCap  int         // values sel holds
	cntCap  int
	part    *allocation // dsa_attend_split's partial results
	partCap int
	// IndexerSelect's scores [rows, nKeys] and topk_select's scratch [rows,
	// 3*nKeys], kept between calls up to dsaKeepScores scores.
	scores, scratch       *allocation
	scoresCap, scratchCap int
}

// dsaKeepScores bounds the scores a selection keeps between calls (16
// bytes each with the scratch): decode over long contexts keeps them, long
// prefills allocate per call (as selectTopK does past the same bound).
const dsaKeepScores = 1 << 22

func (x *dsaIndices) Rows() int { return x.rows }

// read returns the selected indices of every query (for tests).
func (x *dsaIndices) read(b *Backend) ([][]int32, error) {
	if x.rows == 0 {
		return nil, b.Sync()
	}
	cnt := make([]float32, x.rows)
	sel := make([]float32, x.rows*x.k)
	b.Read(cnt, &Buffer{a: x.cnt, ptr: x.cnt.ptr, n: x.rows}, 0)
	b.Read(sel, &Buffer{a: x.sel, ptr: x.sel.ptr, n: x.rows * x.k}, 0)
	if err := b.Sync(); err != nil {
		return nil, err
	}
	out := make([][]int32, x.rows)
	for i := range out {
		n := int(int32(math.Float32bits(cnt[i])))
		for _, v := range sel[i*x.k : i*x.k+n] {
			out[i] = append(out[i], int32(math.Float32bits(v)))
		}
	}
	return out, nil
}

// LayerNorm is layers.LayerNorm over rows of w.Len() values (float32 sums).
func (b *Backend) LayerNorm(dst, x, w, bias backend.Buffer, eps float32) {
	n := w.Len()
	rows := x.Len() / n
	if rows <= 0 {
		return
	}
	b.launch("dsa_layernorm", [3]int{rows, 1, 1}, min(1024, max(32, (n+31)/32*32)), 0, ptr(dst), ptr(x), ptr(w), optPtr(bias), n, eps)
}

// NewIndices allocates an empty selection; its device memory grows on use.
func (b *Backend) NewIndices(s dsa.IndexerShape) (backend.Indices, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("kernels: %w", err)
	}
	return &dsaIndices{shape: s}, nil
}

// grow makes *a hold at least n 4-byte values (reallocating, contents lost).
func (b *Backend) grow(a **allocation, have *int, n int) error {
	if *a != nil && *have >= n {
		return nil
	}
	na, err := b.alloc(4 * max(n, 1))
	if err != nil {
		return err
	}
	*a, *have = na, n
	return nil
}

// IndexerSelect scales the weights, scores every visible key per query
// (idx_scores_tile: a block per 64 keys, all heads; idx_scores, a warp per
// key, for odd shapes) and selects with topk_select.
func (b *Backend) IndexerSelect(idx backend.Indices, q, w, keys backend.Buffer, m, nKeys, pos0 int) {
	x := idx.(*dsaIndices)
	s := x.shape
	x.rows, x.k = 0, 0
	if m <= 0 {
		return
	}
	wv := b.View(w, 0, m*s.Heads)
	b.Scale(wv, wv, s.WeightScale())
	k := min(s.TopK, nKeys)
	if err := b.grow(&x.sel, &x.selCap, m*k); err != nil {
		b.setErr(err)
		return
	}
	if err := b.grow(&x.cnt, &x.cntCap, m); err != nil {
		b.setErr(err)
		return
	}
	x.rows, x.k = m, k
	sel := &Buffer{a: x.sel, ptr: x.sel.ptr, n: m * k}
	score := func(scores uint64) { b.indexScores(scores, q, w, keys, m, nKeys, pos0, s) }
	if m*nKeys > dsaKeepScores {
		b.selectTopK(sel, 0, x.cnt, m, nKeys, s.TopK, k, pos0, 1, score)
		return
	}
	var sp, xp uint64
	if nKeys > 0 {
		if err := b.grow(&x.scores, &x.scoresCap, m*nKeys); err != nil {
			b.setErr(err)
			return
		}
		if err := b.grow(&x.scratch, &x.scratchCap, 3*m*nKeys); err != nil {
			b.setErr(err)
			return
		}
		sp, xp = x.scores.ptr, x.scratch.ptr
		score(sp)
	}
	// The queue keeps the allocations alive until it launches, even if a
	// later call grows them.
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, x.sel, x.cnt, x.scores, x.scratch)
	b.qmu.Unlock()
	b.topK(sp, nKeys, s.TopK, pos0, 1, x.sel.ptr, k, x.cnt.ptr, 0, xp, m)
	runtime.KeepAlive(x)
}

// idxTile is idx_scores_tile's keys per block and heads per chunk (IDX_KT,
// IDX_HC in dsa.cuh).
const idxTile = 64

// idxScoresShare is idx_scores_tile's dynamic shared memory in bytes.
func idxScoresShare(dim int) int {
	return 4 * (2*idxTile*dsaRowStride(dim) + idxTile*idxTile)
}

// idx_scores_mma's limits and shared memory (IDX_MT, IDX_MS, IDX_NS in
// dsa.cuh): at most 64 heads of at most 128 dims, dims a multiple of 8; a
// ring of 3 key tiles and the four head groups' sums of a tile, so that two
// blocks fit on a multiprocessor.
const (
	idxMMAHeads = 64
	idxMMADim   = 128
	idxMMAShare = 4 * (3*64*144 + 4*64)
)

// indexScores writes the indexer scores of m queries over nKeys keys to
// scores ([m, nKeys]).
func (b *Backend) indexScores(scores uint64, q, w, keys backend.Buffer, m, nKeys, pos0 int, s dsa.IndexerShape) {
	b.scoreKeys(scores, q, keys, w, m, nKeys, s.Heads, s.HeadDim, pos0, 1, s.ScoreScale(), true)
}

// scoreKeys is the lightning indexer's scoring, shared by DSA and V4:
// scores[i, e] = sum_h w[i, h] * ReLU(scale * q[i, h] . keys[e]) for the keys
// query i sees (e < (pos0 + i + 1) / rate), -inf beyond; idx_scores_mma
// where the shape allows it, else idx_scores_tile, else idx_scores.
// afterScale: the op queued last is a scale of w alone (IndexerSelect), which
// idx_scores_mma may overlap (overlapAfter).
func (b *Backend) scoreKeys(scores uint64, q, keys, w backend.Buffer, m, n, heads, dim, pos0, rate int, scale float32, afterScale bool) {
	if n <= 0 {
		return
	}
	switch {
	case !b.force.idxMMAOff && heads <= idxMMAHeads && dim > 0 && dim <= idxMMADim && dim%8 == 0 &&
		(ptr(keys)|ptr(q))%16 == 0 && idxMMAShare <= b.opsShare():
		tiles := (n + idxTile - 1) / idxTile
		b.launch("idx_scores_mma", [3]int{min(tiles, 2*b.sms), m, 1}, 256, idxMMAShare, scores,
			ptr(q), ptr(keys), ptr(w), heads, dim, n, pos0, rate, scale)
		if afterScale {
			b.overlapAfter("scale") // IndexerSelect's scale of w, which is all it wrote
		}
	case dim > 0 && dim%4 == 0 && ptr(keys)%16 == 0 && idxScoresShare(dim) <= b.opsShare():
		b.launch("idx_scores_tile", [3]int{(n + idxTile - 1) / idxTile, m, 1}, 256, idxScoresShare(dim), scores,
			ptr(q), ptr(keys), ptr(w), heads, dim, n, pos0, rate, scale)
	default:
		b.launch("idx_scores", [3]int{(n + 7) / 8, m, 1}, 256, 0, scores, ptr(q), ptr(keys), ptr(w),
			heads, dim, n, pos0, rate, scale)
	}
}

// attendSparse launches dsa_attend (see dsa.cuh for the strides).
func (b *Backend) attendSparse(x *dsaIndices, m, heads int, scale float32, args ...any) {
	if m <= 0 {
		return
	}
	if m > x.rows {
		b.setErr(fmt.Errorf("kernels: sparse attention of %d queries with a selection of %d", m, x.rows))
		return
	}
	shared := 4 * max(x.k, 1)
	if shared > b.opsShare() {
		b.setErr(fmt.Errorf("kernels: index_topk %d exceeds this GPU's shared memory", x.k))
		return
	}
	all := append(args, uint64(x.sel.ptr), uint64(x.cnt.ptr), x.k, heads, scale)
	b.launch("dsa_attend", [3]int{heads, m, 1}, 128, shared, all...)
	runtime.KeepAlive(x)
}

// SparseMLAAttention is AttendMLA over the selected tokens, one block per (head, query).
func (b *Backend) SparseMLAAttention(out, q, kv, kRope backend.Buffer, idx backend.Indices, m int, s layers.MLAShape, scale float32) {
	nd, rd, vd, qk := s.NopeDim, s.RopeDim, s.VDim, s.QKDim()
	per := nd + vd
	row := s.Heads * per
	H := s.Heads
	b.attendSparse(idx.(*dsaIndices), m, H, scale,
		ptr(out),
		ptr(q), H*qk, qk, ptr(kv), per, row, nd,
		ptr(q)+uint64(4*nd), H*qk, qk, ptr(kRope), rd, rd,
		ptr(kv)+uint64(4*nd), per, row, vd)
}

// SparseLatentAttention is AttendLatent over the selected tokens: dsa_attend_mma
// or dsa_attend_split (the selected rows read once per 16 heads, the
// selection split over blocks, dsa_attend_combine merging the splits) where
// the shapes allow it, else dsa_attend, one block per (head, query).
func (b *Backend) SparseLatentAttention(out, qLat, q, latent, kRope backend.Buffer, idx backend.Indices, m int, s layers.MLAShape, scale float32) {
	r, rd, nd, qk := s.KVLoraRank, s.RopeDim, s.NopeDim, s.QKDim()
	H := s.Heads
	x := idx.(*dsaIndices)
	if m > 0 && m <= x.rows && b.attendSplitFits(r, rd, ptr(out), ptr(latent), ptr(kRope)) {
		b.attendLatentSplit(x, m, H, scale, ptr(out), ptr(qLat), ptr(q)+uint64(4*nd), H*qk, qk, ptr(latent), ptr(kRope), r, rd)
		return
	}
	b.attendSparse(x, m, H, scale,
		ptr(out),
		ptr(qLat), H*r, r, ptr(latent), 0, r, r,
		ptr(q)+uint64(4*nd), H*qk, qk, ptr(kRope), rd, rd,
		ptr(latent), 0, r, r)
}

// dsa_attend_split's launch constants (DSA_G, DSA_TT, DSA_THREADS and
// DSA_MAX_SPLITS in dsa.cuh).
const (
	dsaGroup     = 16
	dsaTile      = 32
	dsaThreads   = 256
	dsaMaxSplits = 64
)

// dsaRowStride is dsa.cuh's dsa_row_stride: d floats padded to an odd
// number of float4s.
func dsaRowStride(d int) int {
	if (d/4)%2 == 0 {
		return d + 4
	}
	return d + 8
}

// attendSplitShare is dsa_attend_split's dynamic shared memory in bytes.
func attendSplitShare(la, lb int) int {
	return 4 * ((dsaTile+dsaGroup)*dsaRowStride(la+lb) + dsaTile*dsaGroup)
}

// attendSplitFits reports whether dsa_attend_split takes a latent rank la
// and rope dim lb: multiples of 4, la at most 512 (two float4 columns per
// thread), 16-byte aligned rows and output, the tile in shared memory.
func (b *Backend) attendSplitFits(la, lb int, out, latent, rope uint64) bool {
	return la > 0 && la <= 512 && la%4 == 0 && lb >= 0 && lb%4 == 0 &&
		out%16 == 0 && latent%16 == 0 && rope%16 == 0 && attendSplitShare(la, lb) <= b.opsShare()
}

// dsa_attend_mma's shape limits and shared memory (DSA_MKMAX, DSA_RS, DSA_PS
// and dsa_mma_stride in dsa.cuh): la a multiple of 64 (eight warps of 8-column
// tiles), lb of 8, la + lb at most 8 warps x 9 k8 steps.
const (
	dsaMMAMaxD = 576
	dsaMMARS   = 40
	dsaMMAPS   = 24
)

// attendMMAShare is attend_mma's dynamic shared memory in bytes with nw warps.
func attendMMAShare(la, lb, nw int) int {
	ds := (la+lb+31)&^31 + 8
	return 4 * (2*dsaTile*ds + nw*dsaGroup*dsaMMARS + dsaTile*dsaMMAPS)
}

// attendMMAWarps is how many warps attend_mma runs with for latent rank la:
// 16 (dsa_attend_mma16, v4_attention_mma16) where la is a multiple of 128,
// so that every warp owns whole 8-column output tiles, else 8.
func (b *Backend) attendMMAWarps(la int) int {
	if la%128 == 0 && !b.force.attnMMA8 {
		return 16
	}
	return 8
}

// attendMMAKernel is attend_mma's entry point for base (dsa_attend_mma or
// v4_attention_mma) with nw warps.
func attendMMAKernel(base string, nw int) string {
	if nw == 16 {
		return base + "16"
	}
	return base
}

// attendMMAFits reports whether dsa_attend_mma takes the shapes (on top of
// attendSplitFits).
func (b *Backend) attendMMAFits(la, lb int) bool {
	return !b.force.attnMMAOff && la%64 == 0 && lb%8 == 0 && la+lb <= dsaMMAMaxD &&
		attendMMAShare(la, lb, b.attendMMAWarps(la)) <= b.opsShare()
}

// dsaSplits is how many slices the attend kernel cuts a selection of k
// tokens into for rows queries of heads heads, and each slice's length (a
// multiple of the tile): enough blocks to give every SM perSM of them, at
// most dsaMaxSplits, no slice shorter than a tile.
func (b *Backend) dsaSplits(k, rows, heads, perSM int) (splits, per int) {
	groups := (heads + dsaGroup - 1) / dsaGroup
	tiles := max((k+dsaTile-1)/dsaTile, 1)
	want := max(perSM*b.sms, 1)
	splits = min(max((want+groups*rows-1)/(groups*rows), 1), tiles, dsaMaxSplits)
	per = (tiles + splits - 1) / splits * dsaTile
	splits = max((k+per-1)/per, 1)
	return splits, per
}

// attendLatentSplit launches dsa_attend_mma[16] (one block per SM: it holds two
// tiles) or dsa_attend_split (two), and dsa_attend_combine when the
// selection is split; see dsa.cuh for the layouts.
func (b *Backend) attendLatentSplit(x *dsaIndices, m, heads int, scale float32, out, qLat, qRope uint64, qrI, qrH int, lat, rope uint64, la, lb int) {
	name, share, perSM, threads := "dsa_attend_split", attendSplitShare(la, lb), 2, dsaThreads
	mma := b.attendMMAFits(la, lb)
	if mma {
		nw := b.attendMMAWarps(la)
		name, share, perSM, threads = attendMMAKernel("dsa_attend_mma", nw), attendMMAShare(la, lb, nw), 1, nw*32
	}
	splits, per := b.dsaSplits(x.k, m, heads, perSM)
	var part uint64
	if splits > 1 {
		if err := b.grow(&x.part, &x.partCap, m*splits*heads*(la+2)); err != nil {
			b.setErr(err)
			return
		}
		part = x.part.ptr
	}
	// The queue keeps the allocations alive until it launches, even if a
	// later call grows them.
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, x.sel, x.cnt, x.part)
	b.qmu.Unlock()
	groups := (heads + dsaGroup - 1) / dsaGroup
	b.launch(name, [3]int{splits, groups, m}, threads, share, out, part, qLat, qRope,
		qrI, qrH, lat, rope, la, lb, uint64(x.sel.ptr), uint64(x.cnt.ptr), x.k, heads, per, scale)
	if mma {
		b.overlapAfter("topk_select", "tkc_select", "tkc_select16", "tkm_emit")
	}
	if splits > 1 {
		b.launch("dsa_attend_combine", [3]int{heads, m, 1}, 128, 0, out, part, m, heads, la, splits)
	}
	runtime.KeepAlive(x)
}

// overlapAfter launches the kernel just queued with programmatic
// serialization when the one before it is one of prev launched without it.
// Such a kernel lets its successor start at once (pdl_launch) and itself
// ran after every earlier kernel had finished, so the successor may read
// anything older than it before its pdl_wait: dsa_attend_mma builds its
// query fragments under the top-k, idx_scores_mma its own and its first key
// tiles under the weights' scale. After any other op the launch stays
// plain, since a chain of early-triggering kernels could leave such inputs'
// writer still running.
func (b *Backend) overlapAfter(prev ...string) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	ops := b.q.ops
	if n := len(ops); n >= 2 && ops[n-2].kind == opKernel && !ops[n-2].pdl && slices.Contains(prev, ops[n-2].name) {
		ops[n-1].pdl = true
	}
}

// MLAAbsorbQuery folds W_UK (read from kv_b_proj in its stored format) into the nope queries.
func (b *Backend) MLAAbsorbQuery(qLat, q backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	if m <= 0 {
		return
	}
	w := kvB.(*Weight)
	f, data, scales, global := weightArgs(w)
	r := s.KVLoraRank
	b.launch("mla_absorb", [3]int{(r + 127) / 128, s.Heads, m}, 128, 0, ptr(qLat), ptr(q), data, scales, global, f,
		s.Heads, r, s.NopeDim, s.NopeDim+s.VDim, s.QKDim())
	runtime.KeepAlive(w)
}

// MLAExpandOutput applies W_UV to the latent outputs, a warp per output value.
func (b *Backend) MLAExpandOutput(out, outLat backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	total := m * s.Heads * s.VDim
	if total <= 0 {
		return
	}
	w := kvB.(*Weight)
	f, data, scales, global := weightArgs(w)
	b.launch("mla_expand", grid1(total, 8), 256, 0, ptr(out), ptr(outLat), data, scales, global, f,
		m, s.Heads, s.KVLoraRank, s.NopeDim, s.NopeDim+s.VDim, s.VDim)
	runtime.KeepAlive(w)
}
