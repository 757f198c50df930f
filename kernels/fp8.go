package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// FP8 block-scaled weights on the device (fp8.cuh): E4M3 bytes as stored, one
// a weight, and the 128x128 tile scales as float32 (E8M0 scales widen to
// float32 exactly). Weights with other tiles, or with K % 16 != 0, are
// widened at upload instead (widen.go).

// fp8Kept reports whether h (FP8Block) is kept as FP8 on the device: the
// kernels take 128x128 tiles and K a multiple of their 16-byte chunks.
func fp8Kept(h *backend.HostWeight) bool {
	q := h.FP8
	return q != nil && q.BlockRows == fp8Tile && q.BlockCols == fp8Tile && h.Cols%16 == 0
}

// fp8Tile is the scale tile the kernels take (FP8_TILE in fp8.cuh).
const fp8Tile = 128

// fp8Format is the FP8 weight's code for weight_at (dsa.cuh) and weightArgs.
const fp8Format = 3

// fp8GemvMaxM and fp8GemvMaxK bound what the CUDA-core GEMV (gemv_fp8_m*)
// takes by default; the rest take the tensor cores (gemm_fp8_t*). Measured
// on an H100 (BenchmarkFP8GEMV, both kernels at every m): at m = 2 the GEMM
// was faster at all six V3/V4 shapes (74.7 against 103.3 us at 18432 x
// 7168), and at m = 1 with K = 18432 (59.1 against 92.7 us), whose rows the
// GEMV splits too little; at m = 1 and K <= 7168 the GEMV was faster where
// N is large (60.5 against 74.0 us at 18432 x 7168) and within 25% where
// it was not.
const (
	fp8GemvMaxM = 1
	fp8GemvMaxK = 8192
)

// fp8Scales returns h's tile scales as float32 bytes, row-major [ceil(N/128),
// ceil(K/128)].
func fp8Scales(q *quant.FP8Block) []byte {
	sr, sc := q.ScaleShape()
	out := make([]byte, 4*sr*sc)
	for i := range sr * sc {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(q.Scale(i/sc*q.BlockRows, i%sc*q.BlockCols)))
	}
	return out
}

// uploadFP8 puts an FP8Block weight's codes and float32 scales on the device.
func (b *Backend) uploadFP8(w *Weight, h *backend.HostWeight) (err error) {
	if w.data, err = b.upload(h.FP8.Data); err == nil {
		w.scales, err = b.upload(fp8Scales(h.FP8))
	}
	return err
}

// fp8Scratch is gemm_fp8's x in fp16 (t64), split partials and tickets
// (zero between launches), grown as needed; guarded by Backend.partMu.
type fp8Scratch struct {
	xh, part, ticket          *allocation
	xhLen, partLen, ticketLen int
}

// fp8Kernel is the kernel matmulFP8 takes for m tokens: "gemv" (CUDA cores),
// "gemm" (tensor cores) or "tma" (gemv_fp8_tma, m = 1), as forced by
// b.force.fp8 or else by m and K. gemv_fp8_tma is not a default choice yet:
// issue 58's FP8 m = 1 rate is to be measured against gemv_fp8_m1 and the
// GEMM first (BenchmarkFP8GEMV's fp8-tma rows).
func (b *Backend) fp8Kernel(m, K int) string {
	switch b.force.fp8 {
	case fp8ForceGEMV:
		return "gemv"
	case fp8ForceGEMM:
		return "gemm"
	case fp8ForceTMA:
		if m == 1 && b.fp8TMAStages(K) > 0 {
			return "tma"
		}
	}
	if m <= fp8GemvMaxM && K <= fp8GemvMaxK {
		return "gemv"
	}
	return "gemm"
}

// matmulFP8 queues dst[m, N] = x[m, K]·wᵀ (+ bias) for an FP8 weight.
func (b *Backend) matmulFP8(dst, x *Buffer, w *Weight, m int) {
	N, K := w.rows, w.cols
	bias := uint64(0)
	if w.bias != nil {
		bias = w.bias.ptr
	}
	// The weights are constant, so x and dst are all the launches touch that
	// others may (the split GEMM's scratch is its own launches' alone, which
	// run in order): the fusion pass may move operations past them.
	fx := fxOf([]*Buffer{dst}, x)
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, w, x, dst) // alive until launched
	b.qmu.Unlock()
	if x.ptr%16 != 0 || K%16 != 0 {
		b.enqueueFx(fx, "gemv_fp8_any", grid1(N, 8), 256, 0, w.data.ptr, w.scales.ptr, x.ptr, dst.ptr, bias, N, K, m)
		return
	}
	switch b.fp8Kernel(m, K) {
	case "gemv":
		b.queueFP8Gemv(dst, x, w, m, bias)
		return
	case "tma":
		ns := b.fp8TMAStages(K)
		b.enqueueFx(fx, "gemv_fp8_tma", [3]int{min((N+15)/16, b.sms), 1, 1}, (fp8TMAConsumers+1)*32, fp8TMAShared(K, ns),
			w.data.ptr, w.scales.ptr, x.ptr, dst.ptr, bias, N, K, ns)
		return
	}
	bm, name := 64, "gemm_fp8_t64"
	if m <= 16 {
		bm, name = 16, "gemm_fp8_t16"
	}
	ntiles, mtiles, kt := (N+127)/128, (m+bm-1)/bm, (K+fp8Tile-1)/fp8Tile
	splits, cps := gemmSplits(ntiles*mtiles, kt, 2*b.sms, 2)
	b.partMu.Lock()
	s := &b.fp8
	var err error
	if bm == 64 {
		err = b.grow(&s.xh, &s.xhLen, mtiles*bm*K/2) // fp16: K/2 words a token
	}
	if err == nil && splits > 1 {
		if err = b.grow(&s.part, &s.partLen, splits*m*N); err == nil {
			err = b.grow(&s.ticket, &s.ticketLen, ntiles*mtiles) // zeroed by alloc; each launch leaves it zero
		}
	}
	xh, part, ticket := s.xh, s.part, s.ticket
	b.partMu.Unlock()
	if err != nil {
		b.setErr(fmt.Errorf("kernels: FP8 matmul scratch for %d x %d, m = %d: %w", N, K, m, err))
		return
	}
	var pp, tp uint64
	if splits > 1 {
		pp, tp = part.ptr, ticket.ptr
	}
	xp := x.ptr
	if bm == 64 {
		units := mtiles * bm * K / 8
		xhb := &Buffer{ptr: xh.ptr, n: mtiles * bm * K / 2}
		b.enqueueFx(fxOf([]*Buffer{xhb}, x), "fp8_x_h", b.elementGrid(units), 256, 0,
			xh.ptr, x.ptr, m, mtiles*bm, K)
		xp, fx = xh.ptr, fxOf([]*Buffer{dst}, xhb)
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, xh, part, ticket)
	b.qmu.Unlock()
	b.enqueueFx(fx, name, [3]int{ntiles, mtiles, splits}, 256, fp8GemmShared, w.data.ptr, w.scales.ptr, xp, dst.ptr, bias, pp, tp, N, K, m, cps)
}

// gemv_fp8_tma's launch (fp8.cuh): 8 consumer warps and a producer, one
// block a multiprocessor, a ring of up to 8 stages of 16 rows x 1024 bytes
// beside x (K floats) and the ring's mbarriers.
const (
	fp8TMAConsumers = 8
	fp8TMAStage     = 16 * 1024
	fp8TMAMaxStages = 8
)

// fp8TMAShared is gemv_fp8_tma's dynamic shared memory for K and ns stages.
func fp8TMAShared(K, ns int) int { return ns*fp8TMAStage + 4*K + 16*ns }

// fp8TMAStages is the ring gemv_fp8_tma gets at K: as many stages as fit
// the shared memory a kernel may take (up to 8), 0 below two.
func (b *Backend) fp8TMAStages(K int) int {
	ns := min(fp8TMAMaxStages, (b.opsShare()-4*K)/(fp8TMAStage+16))
	if ns < 2 {
		return 0
	}
	return ns
}

// fp8GemmShared is gemm_fp8_t*'s dynamic shared memory, its ring of stages
// (fp8_stage_bytes in fp8.cuh): 4 of 128 weight rows and 16 float32 token
// rows at t16, 3 of 128 weight rows and 64 fp16 token rows at t64.
const fp8GemmShared = 4 * (128*144 + 16*144*4)

// fp8Gemv is one launch of gemv_fp8_m1 or gemv_fp8_m4 (Fp8GemvArgs in
// fp8.cuh): up to three weights of the same K reading the same x, or (xs >
// 0) weight j the row at x + j * xs floats, each writing its own y.
type fp8Gemv struct {
	w, s, y, bias [3]uint64
	x             uint64
	n             [3]int
	k, m, groups  int
	xs            int
}

// params are Fp8GemvArgs as the launch passes it, with kw warps splitting
// K; blocks is the grid.
func (g *fp8Gemv) params(kw int) (p [19]uint64, blocks int) {
	var ends [3]int
	for j := range g.groups {
		blocks += (g.n[j] + 2*(8/kw) - 1) / (2 * (8 / kw))
		ends[j] = blocks
	}
	copy(p[0:], g.w[:])
	copy(p[3:], g.s[:])
	copy(p[6:], g.y[:])
	copy(p[9:], g.bias[:])
	pair := func(a, b int) uint64 { return uint64(uint32(int32(a))) | uint64(uint32(int32(b)))<<32 }
	p[12], p[13], p[14], p[15], p[16], p[17] = g.x, pair(g.n[0], g.n[1]), pair(g.n[2], ends[0]), pair(ends[1], ends[2]), pair(g.k, g.m), pair(kw, g.groups)
	p[18] = uint64(g.xs)
	return p, blocks
}

// fp8GemvOf decodes the launch parameters of a queued gemv_fp8_m* op.
func fp8GemvOf(p []uint64) (g fp8Gemv, ok bool) {
	if len(p) != 19 {
		return g, false
	}
	lo := func(v uint64) int { return int(int32(uint32(v))) }
	hi := func(v uint64) int { return int(int32(uint32(v >> 32))) }
	copy(g.w[:], p[0:3])
	copy(g.s[:], p[3:6])
	copy(g.y[:], p[6:9])
	copy(g.bias[:], p[9:12])
	g.x = p[12]
	g.n = [3]int{lo(p[13]), hi(p[13]), lo(p[14])}
	g.k, g.m, g.groups, g.xs = lo(p[16]), hi(p[16]), hi(p[17]), int(p[18])
	return g, true
}

// queueFP8Gemv queues dst = x·wᵀ on gemv_fp8_m* (w, x and dst are in the
// queue's keep: matmulFP8), joining a queued one of
// the same x (up to three weights a launch) where the fusion pass may move
// it there (pass.go: nothing queued since reads what it writes or writes
// what it reads), as queueGemv does for NVFP4: the projections of one input
// (DeepSeek-V3's q_a and kv_a, V4's) in one launch.
func (b *Backend) queueFP8Gemv(dst, x *Buffer, w *Weight, m int, bias uint64) {
	name := "gemv_fp8_m1"
	if m > 1 {
		name = "gemv_fp8_m4"
	}
	N, K := w.rows, w.cols
	y := span{dst.ptr, dst.ptr + uint64(4*m*N)}
	xs := span{x.ptr, x.ptr + uint64(4*m*K)}
	var fx effects
	fx.read(xs)
	fx.write(y)
	fn := b.function(name)
	if fn == 0 {
		return // b.function kept the error for Sync
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for _, i := range b.candidates() {
		o := &b.q.ops[i]
		if o.kind == opKernel && o.name == name {
			if g, ok := fp8GemvOf(o.params); ok && b.movable(i, &fx) && g.joins(o, xs, y, m, K) {
				j := g.groups
				g.w[j], g.s[j], g.y[j], g.bias[j], g.n[j] = w.data.ptr, w.scales.ptr, dst.ptr, bias, N
				if x.ptr != g.x {
					g.xs = int(x.ptr-g.x) / (4 * j)
				}
				g.groups++
				rows := 0
				for _, n := range g.n[:g.groups] {
					rows += n
				}
				p, blocks := g.params(fp8GemvSplit(rows, K, b.sms))
				o.setParams(p[:])
				o.grid[0] = uint32(blocks)
				o.fx.write(y)
				if x.ptr != g.x {
					o.fx.read(xs)
				}
				return
			}
		}
		if !b.movable(i, &fx) {
			break // nor past the same operations to an older one
		}
	}
	g := fp8Gemv{w: [3]uint64{w.data.ptr}, s: [3]uint64{w.scales.ptr}, y: [3]uint64{dst.ptr}, bias: [3]uint64{bias},
		x: x.ptr, n: [3]int{N}, k: K, m: m, groups: 1}
	p, blocks := g.params(fp8GemvSplit(N, K, b.sms))
	o := op{kind: opKernel, name: name, fn: fn, fx: fx, grid: [3]uint32{uint32(blocks), 1, 1}, block: 256, pdl: pdlKernel(name)}
	o.setParams(p[:])
	b.push(o)
}

// joins reports whether the queued launch g (op o) can take the matmul
// reading xs and writing y: m tokens of K, a free group slot, and either the
// same x as g's (xs == 0), or at m = 1 the row one stride on from g's last
// (joinStrided's rule for NVFP4: DeepSeek-V4's grouped output projection);
// y overlaps no x of the launch and no other y, and no other y overlaps xs
// (the launch's blocks run together).
func (g *fp8Gemv) joins(o *op, xs, y span, m, K int) bool {
	if g.m != m || g.k != K || g.groups >= 3 {
		return false
	}
	if xs.ptr != g.x {
		j := uint64(g.groups)
		d := xs.ptr - g.x
		if m != 1 || xs.ptr < g.x || d%(4*j) != 0 || g.xs != 0 && int(d/(4*j)) != g.xs || g.xs == 0 && g.groups > 1 {
			return false
		}
	} else if g.xs != 0 {
		return false
	}
	if anyOverlap(y, o.fx.reads[:o.fx.nr]) || anyOverlap(y, o.fx.writes[:o.fx.nw]) || y.overlaps(xs) || anyOverlap(xs, o.fx.writes[:o.fx.nw]) {
		return false
	}
	return true
}

// fp8GemvSplit is how many warps of a gemv_fp8 block split K (1, 2, 4 or 8):
// the fewest that give the grid about 16 warps a multiprocessor (so that
// enough loads are in flight), and at least one 16-byte chunk a lane.
func fp8GemvSplit(N, K, sms int) int {
	kw := 1
	for kw < 8 && (N+1)/2*kw < 16*sms && K/16 >= 2*kw*32 {
		kw *= 2
	}
	return kw
}
