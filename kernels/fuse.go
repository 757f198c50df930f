package kernels

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// Decode-shape NVFP4 matmuls (gemv.cuh) and their fusions. A queued matmul
// stays open to what follows it until the queue is launched:
//   - another NVFP4 matmul of the same input (up to three: q, k, v) joins it;
//   - SwiGLU(gate, gate, up) after the gate and up matmuls becomes its epilogue;
//   - Add(r, r, y) after a matmul into y becomes its epilogue (r += y).
// Each fusion checks that the buffers involved do not overlap in a way that
// would let one block's writes reach another block's reads. bf16 matvecs
// are queued and joined the same way among themselves (bf16.go:
// queueGemv16, finalizeGemv16), never with NVFP4 ones.

// gemvGroup is one weight of a fused launch.
type gemvGroup struct {
	w    *Weight
	y    span
	bias uint64
}

// span is a range of device memory in bytes.
type span struct{ ptr, end uint64 }

func spanOf(x backend.Buffer) span {
	xb := x.(*Buffer)
	return span{xb.ptr, xb.ptr + uint64(4*xb.n)}
}

func (s span) overlaps(t span) bool { return s.ptr < t.end && t.ptr < s.end }

type gemvOp struct {
	x      span
	m, K   int
	groups []gemvGroup
	mode   int // 0 plain, 1 SwiGLU of groups 0 (gate) and 1 (up), 2 residual add into res
	res    span
	limit  float32
	norm   *normOp // x is this RMSNorm's output, computed in the matmul (m == 1)
	xs     int     // > 0: group j reads the row at x + j*xs floats (x is group 0's; see joinStrided)
}

// weights is how many weight elements the launch reads.
func (g *gemvOp) weights() int {
	n := 0
	for _, gg := range g.groups {
		n += gg.w.rows * gg.w.cols
	}
	return n
}

// normOp is a queued RMSNorm of one row, which the matmul after it may take in.
type normOp struct {
	dst, x, w span
	eps       float32
}

// gemvDec picks the E2M1 decoding of the NVFP4 kernels (see gemv.cuh): 1 via
// cvt.f16x2.e4m3x2, 0 with integer operations.
const defaultGemvDec = 1

// gemvEligible reports whether the decode-shape NVFP4 kernel takes this
// matmul: m = 1 (for 2 <= m <= 16 the GEMM of gemm.go measured faster; smallM,
// the dev build's, reaches the m <= 16 variants).
func gemvEligible(x, dst *Buffer, w *Weight, m int, smallM bool) bool {
	return w.format == backend.NVFP4 && w.cols%256 == 0 && (m == 1 || smallM && m >= 1 && m <= 16) &&
		x.ptr%16 == 0 && dst.ptr%4 == 0 && x.n >= m*w.cols && dst.n >= m*w.rows
}

// queueGemv queues dst = x·wᵀ, joining the last queued matmul when it can. qmu held.
func (b *Backend) queueGemv(dst, x *Buffer, w *Weight, m int) {
	q := &b.q
	xs, y, bias := b.keepGemv(dst, x, w, m)
	if n := len(q.ops); n > 0 && q.ops[n-1].norm != nil && m == 1 && (b.exp.normStaged() || b.exp.normTMA() && b.tmaStages(w.cols) > 0) {
		// RMSNorm(x, r, nw) then x·wᵀ: the matmul normalizes r while staging it
		// and writes x too; x must not overlap r (blocks read r while block 0 writes x).
		nm := q.ops[n-1].norm
		// The staged row must fit beside the widest pipeline (8 warps).
		fits := 16*4*2304+2*w.cols <= b.maxShare
		if fits && nm.dst == xs && !nm.dst.overlaps(nm.x) && !y.overlaps(xs) && !y.overlaps(nm.x) && !y.overlaps(nm.w) {
			q.ops[n-1] = op{kind: opKernel, gemv: &gemvOp{x: xs, m: m, K: w.cols, norm: nm,
				groups: []gemvGroup{{w: w, y: y, bias: bias}}}}
			return
		}
	}
	// Join a queued matmul of the same input (or, strided, of the next slice
	// of it).
	join := func(g *gemvOp) bool { return b.joinStrided(g, xs, y, w, bias, m) || joinGroup(g, xs, y, w, bias, m) }
	if b.joinQueued(xs, y, join) {
		return
	}
	b.push(op{kind: opKernel, gemv: &gemvOp{x: xs, m: m, K: w.cols,
		groups: []gemvGroup{{w: w, y: y, bias: bias}}}})
}

// keepGemv keeps dst, x and w for the queue's life and returns the spans
// the matmul dst = x·wᵀ of m rows reads and writes, and w's bias (0 for
// none). qmu held.
func (b *Backend) keepGemv(dst, x *Buffer, w *Weight, m int) (xs, y span, bias uint64) {
	xs = span{x.ptr, x.ptr + uint64(4*m*w.cols)}
	y = span{dst.ptr, dst.ptr + uint64(4*m*w.rows)}
	if w.bias != nil {
		bias = w.bias.ptr
	}
	b.q.keep = append(b.q.keep, dst, x, w)
	return xs, y, bias
}

// joinQueued offers the matmul that reads xs and writes y to the queued
// matmuls among the last fuseWindow operations as epilogue offers an
// elementwise op (newest first, while nothing queued since reads what it
// writes or writes what it reads: pass.go): join reports whether g took
// it. qmu held.
func (b *Backend) joinQueued(xs, y span, join func(g *gemvOp) bool) bool {
	var fx effects
	fx.read(xs)
	fx.write(y)
	return b.epilogue(fx, join)
}

// joinGroup adds the matmul x·wᵀ -> y to g when g reads the same x (up to
// three weights a launch) and nothing of g overlaps y.
func joinGroup(g *gemvOp, xs, y span, w *Weight, bias uint64, m int) bool {
	ok := g.mode == 0 && g.xs == 0 && len(g.groups) < 3 && g.x == xs && g.m == m && g.K == w.cols && !y.overlaps(xs) &&
		g.groups[0].w.format == w.format
	if g.norm != nil {
		ok = ok && !y.overlaps(g.norm.x) && !y.overlaps(g.norm.w)
	}
	for _, gg := range g.groups {
		ok = ok && !y.overlaps(gg.y)
	}
	if ok {
		g.groups = append(g.groups, gemvGroup{w: w, y: y, bias: bias})
	}
	return ok
}

// joinStrided joins a one-row matmul to the queued one g when each reads its
// own row of x at a fixed stride (as DeepSeek-V4's grouped output
// projection: x·W_jᵀ over slice j of the attention output): up to three
// weights of one shape in one launch of gemv_nvfp4_tma*, whose blocks then
// stage the row of their weight. Only where every block takes a single
// tile, so that no block needs two rows. qmu held.
func (b *Backend) joinStrided(g *gemvOp, xs, y span, w *Weight, bias uint64, m int) bool {
	k, tiles := len(g.groups), (len(g.groups)+1)*((w.rows+15)/16)
	if m != 1 || g.m != 1 || g.mode != 0 || g.norm != nil || k >= 3 || g.K != w.cols || g.groups[0].w.rows != w.rows ||
		g.groups[0].w.format != w.format ||
		b.tmaStages(w.cols) == 0 || b.tmaGrid(tiles) < tiles {
		return false
	}
	if xs.end-xs.ptr != g.x.end-g.x.ptr || xs.ptr <= g.x.ptr || (xs.ptr-g.x.ptr)%(4*uint64(k)) != 0 {
		return false
	}
	stride := int((xs.ptr - g.x.ptr) / (4 * uint64(k))) // floats
	if g.xs != 0 && stride != g.xs || k == 1 && stride < g.K {
		return false
	}
	all := span{g.x.ptr, xs.end} // every group's row
	if y.overlaps(all) {
		return false
	}
	for _, gg := range g.groups { // blocks of other weights may still read xs when these write
		if y.overlaps(gg.y) || gg.y.overlaps(xs) {
			return false
		}
	}
	g.xs = stride
	g.groups = append(g.groups, gemvGroup{w: w, y: y, bias: bias})
	return true
}

// tmaGrid is the grid of gemv_nvfp4_tma8* over total tiles (block x takes
// tiles x, x + grid, ...): persistent blocks, two per multiprocessor (at
// most one per tile), or force.tmaTPB tiles a block where a test sets it.
// The dev build's experiments may take other grids (dev.go).
func (b *Backend) tmaGrid(total int) int {
	if b.force.tmaTPB > 0 {
		return (total + b.force.tmaTPB - 1) / b.force.tmaTPB
	}
	if grid, ok := b.exp.tmaGrid(total, b.sms); ok {
		return grid
	}
	return tmaBalanced(total, tmaOcc*b.sms)
}

// tmaOcc is how many gemv_nvfp4_tma8* blocks (8 consumer warps each) share
// a multiprocessor: shared memory and registers are split so many ways.
const tmaOcc = 2

// tmaBalanced is a grid of at most slots blocks over total tiles with as
// many tiles for every block: the fewest blocks that take ceil(total /
// slots) tiles each.
func tmaBalanced(total, slots int) int {
	per := (total + slots - 1) / slots
	return (total + per - 1) / per
}

// longGemv reports whether an m = 1 launch's blocks have more stages to copy
// (a partial last stage of a tile counted as one) than their ns ring slots:
// copies remain to be issued after its release, and it keeps the memory busy
// to its end.
func longGemv(K, total, grid, ns int) bool { return (total+grid-1)/grid*((K+2047)/2048) > ns }

// paceOf is the pace of an m = 1 launch's first ring fill (GemvArgs.flags
// bits 25-27): defaultTMAPace for a long launch after a long launch, 0 (all at once)
// otherwise. After a long launch the memory is busy through the boundary, so
// copies issued before the release only queue, and x's loads behind them;
// after a short one (the output projection before the gate and up matmuls),
// whose copies were all issued early, the memory would idle unless the whole
// ring is asked for at once. The gate and up matmuls with the SwiGLU epilogue
// measured slower paced even after a long launch, so they are not
// (docs/PERFORMANCE.md round 40). Without programmatic dependent launch
// nothing overlaps the boundary: no pace. The dev build may set another
// pace, or pace every launch (dev.go).
func (b *Backend) paceOf(long, afterLong, swiglu bool) int {
	if p, ok := b.exp.paceOf(long, afterLong, swiglu, b.pdl); ok {
		return p
	}
	if long && afterLong && !swiglu && b.pdl {
		return defaultTMAPace
	}
	return 0
}

// fuseSwiGLU makes SwiGLU(dst=gate, gate, up) the epilogue of the queued
// matmul pair that writes gate and up, when it can run there (pass.go). qmu held.
func (b *Backend) fuseSwiGLU(dst, gate, up *Buffer, limit float32) bool {
	if dst.ptr != gate.ptr || dst.n != gate.n || up.n != gate.n {
		return false
	}
	return b.epilogue(fxOf([]*Buffer{gate, up}, gate, up), func(g *gemvOp) bool {
		if g.mode != 0 || g.xs != 0 || len(g.groups) != 2 {
			return false
		}
		gs, us := g.groups[0], g.groups[1]
		N := gs.w.rows
		if gs.y.ptr != gate.ptr || us.y.ptr != up.ptr || us.w.rows != N || gate.n != g.m*N {
			return false
		}
		g.mode, g.limit = 1, limit
		return true
	})
}

// fuseAdd makes dst = a + c (dst being a or c, the other a queued matmul's
// output) that matmul's epilogue, when it can run there (pass.go). qmu held.
func (b *Backend) fuseAdd(dst, a, c *Buffer) bool {
	if dst.n != a.n || dst.n != c.n {
		return false
	}
	return b.epilogue(fxOf([]*Buffer{a, c}, a, c), func(g *gemvOp) bool {
		// One weight, plain; the residual must not be the normalized row the matmul reads.
		if g.mode != 0 || len(g.groups) != 1 || g.norm != nil {
			return false
		}
		y := g.groups[0].y
		var other *Buffer
		switch {
		case y.ptr == c.ptr && dst.ptr == a.ptr:
			other = a
		case y.ptr == a.ptr && dst.ptr == c.ptr:
			other = c
		default:
			return false
		}
		res := spanOf(other)
		if res.end-res.ptr != y.end-y.ptr || res.overlaps(g.x) || res.overlaps(y) {
			return false
		}
		g.mode, g.res = 2, res
		b.q.keep = append(b.q.keep, other)
		return true
	})
}

// epilogue offers an elementwise op with effects fx to the queued matmuls,
// newest first, while it can run at their place: take reports whether a
// matmul took it in (and makes it so). qmu held.
func (b *Backend) epilogue(fx effects, take func(g *gemvOp) bool) bool {
	for _, i := range b.candidates() {
		g := b.q.ops[i].gemv
		if g == nil {
			continue
		}
		if !b.movable(i, &fx) {
			return false
		}
		if take(g) {
			return true
		}
	}
	return false
}

// The bulk-copy kernel's shared memory (gemv.cuh): tmaStage bytes per ring
// slot, then x staged as fp16 (2 bytes per element) and tmaFixed bytes of
// zeros, reductions and barriers.
const (
	tmaStage    = 16*1088 + 16*144
	tmaFixed    = 16*130 + 2*16*16*4 + 16*4 + 2*8*8 // TMA_ZERO uint4 of zeros, red, nred, barriers
	tmaMaxSlots = 8
	// defaultTMAPace: the first ring fill of a long m = 1 launch after a long
	// one copies a stage once the one before it has arrived (paceOf).
	defaultTMAPace = 1
)

// tmaStages is the ring depth of gemv_nvfp4_tma8 for K, or 0 when the kernel
// does not take it (forced off, K not a multiple of 256, or under 2 slots
// fit). A block takes at most half the shared memory (tmaOcc blocks a
// multiprocessor). Where K % 2048 != 0 the last stage of each tile is
// partial (gemv.cuh): its copies of each row are multiples of 16 bytes (K %
// 256 == 0), as bulk copies and the scales' tensor map's row stride need;
// it still takes a whole ring slot, and x (2 bytes per element) is staged to
// K only, so the sizes below hold as they are.
func (b *Backend) tmaStages(K int) int { return b.tmaStagesOf(K, tmaStage, 0) }

// tmaStagesOf is tmaStages for ring slots of stage bytes and extra bytes
// of shared memory besides.
func (b *Backend) tmaStagesOf(K, stage, extra int) int {
	if b.force.noGemvTMA || K%256 != 0 {
		return 0
	}
	share := (b.maxShare+1024)/tmaOcc - 1024
	if s, ok := b.exp.tmaShare(b.maxShare); ok {
		share = s
	}
	ns := min(tmaMaxSlots, (share-2*K-tmaFixed-extra)/stage)
	if b.force.tmaSlots > 0 {
		ns = min(ns, b.force.tmaSlots)
	}
	if ns < 2 {
		return 0
	}
	return ns
}

// gemvKernelName is gemv_nvfp4_<kind>_d<dec>, spelled out for the
// production build's choices: finalize names every queued matmul, and a
// formatted name was an allocation a launch.
func gemvKernelName(kind string, dec int) string {
	if dec == 1 {
		switch kind {
		case "s1":
			return "gemv_nvfp4_s1_d1"
		case "m1":
			return "gemv_nvfp4_m1_d1"
		case "m8":
			return "gemv_nvfp4_m8_d1"
		case "m16":
			return "gemv_nvfp4_m16_d1"
		}
	}
	return fmt.Sprintf("gemv_nvfp4_%s_d%d", kind, dec)
}

// finalizeGemv fills in the kernel, launch shape and parameters of a queued matmul.
func (b *Backend) finalizeGemv(o *op, afterLong bool) {
	g := o.gemv
	var tiles [3]int
	total := 0
	if g.mode == 1 {
		total = (g.groups[0].w.rows + 7) / 8
		tiles[0], tiles[1], tiles[2] = total, total, total
	} else {
		for i, gg := range g.groups {
			total += (gg.w.rows + 15) / 16
			tiles[i] = total
		}
		for i := len(g.groups); i < 3; i++ {
			tiles[i] = total
		}
	}
	// Warps per tile (splitting K): as many as fit the GPU at once (about 22
	// per multiprocessor at 88 registers), at most 16 and one per 256-element
	// chunk. The kernels are bound by instruction latency, not by bytes in
	// flight: many warps with 2 pipeline stages beat few with deep pipelines.
	st := 2
	if b.exp.gemvSt4() {
		st = 4
	}
	perSM := 22
	switch {
	case st == 4:
		perSM = 16
	case b.exp.gemvLB() && g.m == 1:
		perSM = 32
	}
	kw := min(max(perSM*b.sms/total, 1), 16, max(g.K/256, 1))
	mr := 16
	switch {
	case g.m == 1 && (g.norm != nil || !b.exp.gemvX8()):
		mr = 1
	case g.m <= 8:
		mr = 8
	}
	// m == 1: activations staged per block (s1), or streamed with the
	// weights (m1, slower on the H100: see docs/PERFORMANCE.md).
	kind := "m16"
	switch mr {
	case 1:
		kind = "m1"
	case 8:
		kind = "m8"
	}
	shared := kw * st * 2304
	switch {
	case mr == 1 && (g.norm != nil || !b.force.gemvPipe) && shared+2*g.K <= b.maxShare:
		kind, shared = "s1", shared+2*g.K
	case mr == 1:
		shared = kw * st * (2304 + 1024)
	}
	dec := b.exp.gemvDec()
	o.name = gemvKernelName(kind, dec)
	if st == 4 {
		o.name = "gemv_nvfp4_s1_d1_st4" // the dev build's (with gemvDec 1, m == 1)
	}
	// Several tiles per block (m == 1, x staged): x is read from L2 and
	// staged once per T tiles instead of once per tile. T doubles while the
	// block stays within 32 warps, the grid still covers 90% of the
	// multiprocessors (measured better in decode than requiring all of them:
	// docs/PERFORMANCE.md) and all its blocks fit on the GPU at once.
	tpb := 1
	if b.exp.gemvLB() && kind == "s1" && dec == 1 {
		o.name = "gemv_nvfp4_s1_d1_lb"
		if t := b.force.gemvTiles; t > 1 && t*kw <= 32 && t*kw*st*2304+2*g.K <= b.maxShare {
			tpb = t // tests: a given T
		} else if !b.force.gemvOneTile {
			for {
				t2 := 2 * tpb
				bw := t2 * kw
				if bw > 32 {
					break
				}
				grid := (total + t2 - 1) / t2
				sh := bw*st*2304 + 2*g.K
				perSM := min(32/bw, b.maxShare/(sh+1024))
				if sh > b.maxShare || perSM < 1 || grid < b.sms*9/10 || grid > perSM*b.sms {
					break
				}
				tpb = t2
			}
		}
		if tpb > 1 {
			o.name = "gemv_nvfp4_s1_d1_mt"
			shared = tpb*kw*st*2304 + 2*g.K
		}
	}
	o.grid = [3]uint32{uint32((total + tpb - 1) / tpb), 1, 1}
	o.block = uint32(32 * kw * tpb)
	o.shared = uint32(shared)
	flags := b.exp.gemvFlags() | tpb<<8
	var maps []*tensorMaps
	if ns := b.tmaStages(g.K); ns > 0 && g.m == 1 {
		// Persistent blocks of 8 consumer warps, tmaOcc a multiprocessor
		// (at most one per tile); the dev build may take another kernel.
		o.name, o.block = "gemv_nvfp4_tma8", 9*32
		o.grid = [3]uint32{uint32(b.tmaGrid(total)), 1, 1}
		b.exp.tmaKernel(o)
		o.shared = uint32(ns*tmaStage + 2*g.K + tmaFixed)
		long := longGemv(g.K, total, int(o.grid[0]), ns)
		flags = ns<<16 | boolInt(b.exp.tmaEvict())<<24 | b.paceOf(long, afterLong, g.mode == 1)<<25
		// Tensor copies where every weight has its maps and a ring fits (1 KB more for alignment).
		if tns := b.tmaStagesOf(g.K, tmStage, 1024); o.name == "gemv_nvfp4_tma8" && tns > 0 {
			if maps = b.groupMaps(g); maps != nil {
				o.name = "gemv_nvfp4_tma8_tm"
				o.shared = uint32(1024 + tns*tmStage + 2*g.K + tmaFixed)
				long = longGemv(g.K, total, int(o.grid[0]), tns)
				flags = tns<<16 | boolInt(b.exp.tmaEvict())<<24 | b.paceOf(long, afterLong, g.mode == 1)<<25
			}
		}
		b.afterLong = long
		// The dev build's ablations and timeline (flags bits 4-6, which
		// only its tracing instances take); nothing in production.
		flags = b.exp.gemvAblate(o, g, flags)
	}
	o.fn, o.pdl = b.fn[o.name], pdlKernel(o.name)
	var a [26]uint64
	a[24] = uint64(flags) << 32
	var global [4]float32
	var N [3]int
	for i, gg := range g.groups {
		a[i], a[3+i], a[6+i], a[9+i] = gg.w.data.ptr, gg.w.scales.ptr, gg.y.ptr, gg.bias
		global[i], N[i] = gg.w.global, gg.w.rows
	}
	global[3] = g.limit
	ngroups := len(g.groups)
	if g.mode == 1 {
		ngroups = 1 // every tile holds features of both weights
	}
	pair := func(lo, hi uint32) uint64 { return uint64(lo) | uint64(hi)<<32 }
	f := math.Float32bits
	a[12], a[13] = g.x.ptr, g.res.ptr
	a[14] = pair(f(global[0]), f(global[1]))
	a[15] = pair(f(global[2]), f(global[3]))
	a[16] = pair(uint32(N[0]), uint32(N[1]))
	a[17] = pair(uint32(N[2]), uint32(tiles[0]))
	a[18] = pair(uint32(tiles[1]), uint32(tiles[2]))
	a[19] = pair(uint32(g.K), uint32(g.m))
	a[20] = pair(uint32(ngroups), uint32(g.mode))
	if nm := g.norm; nm != nil {
		a[21], a[22], a[23], a[24] = nm.x.ptr, nm.w.ptr, nm.dst.ptr, uint64(f(nm.eps))|uint64(flags)<<32
	} else {
		a[23] = b.exp.gemvTimeline(flags) // the dev build's timeline words in the norm output's slot (flags bit 6); 0 in production
	}
	a[25] = uint64(g.xs)
	if maps == nil {
		o.setStruct(a[:])
		return
	}
	// GemvArgsTM: GemvArgs padded to 256 bytes, then the weights' and the
	// scales' tensor maps (64-byte aligned, 128 bytes each).
	var at [128]uint64
	copy(at[:], a[:])
	for i, m := range maps {
		copy(at[32+16*i:], m.w[:])
		copy(at[80+16*i:], m.s[:])
	}
	o.setStruct(at[:])
}

// tensorMaps are a weight's CUtensorMaps for gemv_nvfp4_tma8_tm: its E2M1
// bytes as [row][segment][32 words] (segments of 128 bytes, boxes of 8 rows x
// 8 segments: one row block of a stage) and its scales as [row][words]
// (boxes of 8 rows x 32 words: a row block's scales of a stage), both with
// the 128-byte swizzle the kernel reads back. A partial last stage's boxes
// reach past K (as the last row block's past N): the copy fills those
// elements with zeros and counts them toward the barrier's bytes.
type tensorMaps struct{ w, s [16]uint64 }

// The CUtensorMapEncodeTiled enums used here.
const (
	tmUint32     = 2 // CU_TENSOR_MAP_DATA_TYPE_UINT32
	tmSwizzle128 = 3 // CU_TENSOR_MAP_SWIZZLE_128B
	tmL2Promo256 = 3 // CU_TENSOR_MAP_L2_PROMOTION_L2_256B
)

// tmStage is gemv_nvfp4_tma8_tm's ring slot (TM_STAGE in gemv.cuh).
const tmStage = 18432

// tmaMapsMin is the fewest weight elements a launch reads for tensor copies:
// on the H100 they were faster at 14336 x 4096 and 4096 x 14336 (58.7 M) but
// slower at 6144 x 4096 (25.2 M) than row copies (docs/PERFORMANCE.md round
// 25), and slower for the q, k, v launch of the Llama-3-8B-shape decode step
// (round 32). A one-weight launch with the residual add and tiles of at most
// tmaMapsResK columns (an output projection) takes them from tmaMapsResMin:
// in that step they were faster for its 4096 x 4096 (round 32), and slower
// for the 2048 x 8192 down projection of the Llama-3.2-1B-shape step, four
// stages a tile (round 33).
const (
	tmaMapsMin    = 32 << 20
	tmaMapsResMin = 16 << 20
	tmaMapsResK   = 4096
)

// groupMaps returns the tensor maps of every weight of g (nil when tensor
// copies are off, the launch reads fewer elements than it takes them from,
// or a weight has none).
func (b *Backend) groupMaps(g *gemvOp) []*tensorMaps {
	if b.force.tmaRows {
		return nil
	}
	least := tmaMapsMin
	if g.mode == 2 && len(g.groups) == 1 && g.K <= tmaMapsResK && !b.exp.mapsBySize() {
		least = tmaMapsResMin
	}
	if g.weights() < least && !b.force.tmaMapsAll {
		return nil
	}
	var maps []*tensorMaps
	for _, gg := range g.groups {
		m := b.tensorMapsOf(gg.w)
		if m == nil {
			return nil
		}
		maps = append(maps, m)
	}
	return maps
}

// tensorMapsOf encodes w's tensor maps on first use; nil when the driver
// cannot (no cuTensorMapEncodeTiled, or it refuses the shape).
func (b *Backend) tensorMapsOf(w *Weight) *tensorMaps {
	if w.mapsTried {
		return w.maps
	}
	w.mapsTried = true
	enc := b.d.cuTensorMapEncodeTiled
	if enc == nil || w.format != backend.NVFP4 || w.cols%256 != 0 || w.data.ptr%16 != 0 || w.scales.ptr%16 != 0 {
		return nil
	}
	K, N := uint64(w.cols), uint64(w.rows)
	m := &tensorMaps{}
	dims, strides := [3]uint64{32, N, K / 256}, [2]uint64{K / 2, 128}
	box, one := [3]uint32{32, 8, 8}, [3]uint32{1, 1, 1}
	if enc(unsafe.Pointer(&m.w), tmUint32, 3, w.data.ptr, unsafe.Pointer(&dims), unsafe.Pointer(&strides),
		unsafe.Pointer(&box), unsafe.Pointer(&one), 0, tmSwizzle128, tmL2Promo256, 0) != 0 {
		return nil
	}
	sdims, sstrides, sbox := [2]uint64{K / 64, N}, [1]uint64{K / 16}, [2]uint32{32, 8}
	if enc(unsafe.Pointer(&m.s), tmUint32, 2, w.scales.ptr, unsafe.Pointer(&sdims), unsafe.Pointer(&sstrides),
		unsafe.Pointer(&sbox), unsafe.Pointer(&one), 0, tmSwizzle128, tmL2Promo256, 0) != 0 {
		return nil
	}
	w.maps = m
	return m
}

// ropeOp is a queued RoPE of one or two tensors (q, then k), each after
// the in-place per-head RMSNorm it took in, if any (w1, w2: their weights of
// stride values, 0 for none; eps theirs).
type ropeOp struct {
	x1, x2         span
	heads1, heads2 int
	rows, stride   int
	off, half      int
	posRel         int
	freqs          uint64
	scale          float32
	inter, inverse int
	w1, w2         uint64
	eps            float32
}

// queueRoPE queues a RoPE, joining the last queued one when only the tensor differs. qmu held.
func (b *Backend) queueRoPE(x *Buffer, rows, heads, stride, off, pos0 int, r *layers.RoPE, freqs uint64, inverse bool) {
	q := &b.q
	ro := ropeOp{x1: spanOf(x), heads1: heads, rows: rows, stride: stride, off: off, half: len(r.InvFreq),
		posRel: q.posRel(pos0), freqs: freqs, scale: r.Scale}
	if r.Interleaved {
		ro.inter = 1
	}
	if inverse {
		ro.inverse = 1
	}
	q.keep = append(q.keep, x)
	b.takeHeadNorm(&ro)
	// Join a queued RoPE that differs only in the tensor (and its norm's
	// weight): this one runs there, or that one here, whichever the
	// operations between allow (pass.go).
	var fx effects
	fx.read(ro.x1)
	fx.write(ro.x1)
	for _, i := range b.candidates() {
		p := q.ops[i].rope
		if p == nil || p.x2.ptr != 0 || p.rows != ro.rows || p.stride != ro.stride || p.off != ro.off || p.half != ro.half ||
			p.posRel != ro.posRel || p.freqs != ro.freqs || p.scale != ro.scale || p.inter != ro.inter ||
			p.inverse != ro.inverse || p.x1.overlaps(ro.x1) || p.w1 != 0 && ro.w1 != 0 && p.eps != ro.eps {
			continue
		}
		if !b.movable(i, &fx) {
			if !b.sinkable(i) {
				continue
			}
			b.sink(i)
		}
		p.x2, p.heads2, p.w2 = ro.x1, ro.heads1, ro.w1
		if ro.w1 != 0 {
			p.eps = ro.eps
		}
		return
	}
	b.push(op{kind: opKernel, rope: &ro})
}

// takeHeadNorm moves a queued in-place RMSNorm of each of ro's vectors
// (Qwen3's q_norm or k_norm before the RoPE of q or k) into ro, which is
// about to be queued at the end: the norm sinks there (nothing queued after
// it touches its tensor) and the RoPE's launch normalizes each vector before
// rotating it (rope_norm_dyn), one launch instead of the norm's, for prompts
// and batches; a one-row attention then takes both in (attnRow). qmu held.
func (b *Backend) takeHeadNorm(ro *ropeOp) {
	ro.w1, ro.eps, _ = b.takeNorm(ro.x1, ro.stride, ro.rows*ro.heads1, 0, false)
}

// takeNorm drops the queued in-place RMSNorm of x's rows vectors of n
// values when it can sink to the end of the queue (nothing queued after it
// touches x), and with match only one of epsilon eps, and returns its weight
// and epsilon: the caller's launch, queued next, applies it. w is 0 when
// none was taken. qmu held.
func (b *Backend) takeNorm(x span, n, rows int, eps float32, match bool) (w uint64, e float32, ok bool) {
	q := &b.q
	for _, i := range b.candidates() {
		h := q.ops[i].hnorm
		if h == nil || h.x != x {
			continue
		}
		if h.n != n || h.rows != rows || match && h.eps != eps || !b.sinkable(i) {
			return 0, 0, false
		}
		copy(q.ops[i:], q.ops[i+1:])
		q.ops[len(q.ops)-1] = op{}
		q.ops = q.ops[:len(q.ops)-1]
		b.pushed-- // never launched
		return h.w, h.eps, true
	}
	return 0, 0, false
}

func (b *Backend) finalizeRoPE(o *op) {
	r := o.rope
	o.block, o.shared = 256, 0
	if r.w1 != 0 || r.w2 != 0 { // a warp a vector
		o.name = "rope_norm_dyn"
		o.pdl, o.fn = pdlKernel(o.name), b.fn[o.name]
		o.grid = [3]uint32{uint32((r.rows*(r.heads1+r.heads2) + 7) / 8), 1, 1}
		o.setParams(r.x1.ptr, r.heads1, r.x2.ptr, r.heads2, r.freqs, r.rows, r.stride, r.off, r.half, b.dyn.ptr,
			r.posRel, r.scale, r.inter, r.inverse, r.w1, r.w2, r.eps)
		return
	}
	total := r.rows * (r.heads1 + r.heads2) * r.half
	o.name = "rope_dyn"
	o.pdl = pdlKernel(o.name)
	o.fn = b.fn[o.name]
	o.grid = [3]uint32{uint32((total + 255) / 256), 1, 1}
	o.setParams(r.x1.ptr, r.heads1, r.x2.ptr, r.heads2, r.freqs, r.rows, r.stride, r.off, r.half, b.dyn.ptr,
		r.posRel, r.scale, r.inter, r.inverse)
}

// headNorm is a queued in-place RMSNorm of rows rows of n values (Qwen3's
// per-head q_norm and k_norm: a row a head), which a one-row attention
// launch of exactly those heads takes in (attnRow).
type headNorm struct {
	x       span
	w       uint64
	n, rows int
	eps     float32
}

// queueNorm queues RMSNorm of rows of w's length; one row may be taken in by
// the NVFP4 matmul that follows. qmu held.
func (b *Backend) queueNorm(dst, x, w *Buffer, eps float32) {
	q := &b.q
	n := w.n
	rows := x.n / n
	o := op{kind: opKernel, name: "rmsnorm", fn: b.fn["rmsnorm"], grid: [3]uint32{uint32(rows), 1, 1},
		block: uint32(min(1024, max(32, (n+31)/32*32))), pdl: pdlKernel("rmsnorm")}
	o.setSlots(dst.ptr, x.ptr, w.ptr, slotInt(n), slotF32(eps))
	o.fx = fxOf([]*Buffer{dst}, x, w)
	if rows == 1 && dst.n == n && n%256 == 0 && x.ptr%16 == 0 && w.ptr%16 == 0 && dst.ptr%16 == 0 {
		o.norm = &normOp{dst: spanOf(dst), x: spanOf(x), w: spanOf(w), eps: eps}
	}
	if dst.ptr == x.ptr && dst.n == x.n && x.n == rows*n {
		o.hnorm = &headNorm{x: spanOf(x), w: w.ptr, n: n, rows: rows, eps: eps}
	}
	q.keep = append(q.keep, dst, x, w)
	b.push(o)
}

// finalize builds the parameters of fusable operations once nothing more can join them.
// Ops are finalized in launch order, so b.afterLong tells each whether the
// launch before it is a long m = 1 matmul (paceOf).
func (b *Backend) finalize(o *op) {
	after := b.afterLong
	b.afterLong = false
	switch {
	case o.gemv != nil && o.gemv.groups[0].w.format == backend.BF16:
		b.finalizeGemv16(o) // bf16.go
	case o.gemv != nil:
		b.finalizeGemv(o, after)
	case o.rope != nil:
		b.finalizeRoPE(o)
	}
}
