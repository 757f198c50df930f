package kernels

import (
	"fmt"
	"slices"
)

// gemmScratch is the NVFP4 GEMM's device memory, grown as needed and shared
// by its launches (which run one after another on the stream): x as fp16
// pairs, the split partials and the tickets (zero between launches).
type gemmScratch struct {
	xh, part, ticket          *allocation
	xhLen, partLen, ticketLen int
}

// gemmKernel is one of gemm.cuh's gemm_nvfp4 variants: its token tile
// (bm), ring stages (ns), elements of K per stage (kc), blocks per
// multiprocessor (occ) and 16-feature groups a warp (fg; 256 / fg threads a
// block), as its GEMM_NVFP4_TILE line declares them.
type gemmKernel struct{ bm, ns, kc, occ, fg int }

// gemmPick picks the variant for m tokens, N features and K on sms
// multiprocessors. Where K % 512 == 0, stages of 512 elements (256 bytes of
// each weight row) in one block a multiprocessor with a deeper ring: up to 16
// tokens where that grid, K split to fill the multiprocessors, leaves at most
// a fifth of them idle, and up to 64 where the feature tiles alone do
// (docs/PERFORMANCE.md round 35: up to 23% faster there; slower where the
// grid leaves multiprocessors idle, and at m = 512). Otherwise the smallest
// token tile that holds m (at most 64), two or three blocks a multiprocessor,
// stages of 256 elements where K allows, and past 64 tokens two feature groups
// a warp. k128 and k256 (tests and benchmarks: Backend.force) force stages of
// 128 or 256 elements, as K % 512 != 0 and K % 256 != 0 take them.
func gemmPick(m, N, K, sms int, k128, k256 bool) gemmKernel {
	if m <= 64 && K%512 == 0 && !k128 && !k256 {
		k := gemmKernel{8, 4, 512, 1, 1}
		switch {
		case m > 32:
			k = gemmKernel{64, 2, 512, 1, 1}
		case m > 16:
			k = gemmKernel{32, 3, 512, 1, 1}
		case m > 8:
			k = gemmKernel{16, 3, 512, 1, 1}
		}
		tiles := (N + 127) / 128
		splits, _ := gemmSplits(tiles, K/512, sms, 1)
		if 5*tiles >= 4*sms || m <= 16 && 5*tiles*splits >= 4*sms {
			return k
		}
	}
	vs := [4]gemmKernel{{8, 4, 128, 3, 1}, {16, 4, 128, 3, 1}, {32, 4, 128, 2, 1}, {64, 3, 128, 2, 1}}
	if K%256 == 0 && !k128 {
		vs = [4]gemmKernel{{8, 4, 256, 2, 1}, {16, 4, 256, 2, 1}, {32, 3, 256, 2, 1}, {64, 2, 256, 2, 1}}
	}
	i := 0
	for i < len(vs)-1 && vs[i].bm < m {
		i++
	}
	if m > 64 && vs[i].kc == 256 {
		// Prefill chunks: two 16-feature groups a warp (4 warps a block), each
		// B fragment loaded from shared memory serving both (3-5% faster at m
		// = 512, 22-30% slower at m = 64 on half the warps; round 35).
		return gemmKernel{64, 2, 256, 2, 2}
	}
	return vs[i]
}

// gemmKernels are every variant gemm.cuh declares (GEMM_NVFP4_TILE lines).
var gemmKernels = []gemmKernel{
	{8, 4, 128, 3, 1}, {16, 4, 128, 3, 1}, {32, 4, 128, 2, 1}, {64, 3, 128, 2, 1},
	{8, 4, 256, 2, 1}, {16, 4, 256, 2, 1}, {32, 3, 256, 2, 1}, {64, 2, 256, 2, 1},
	{8, 4, 512, 1, 1}, {16, 3, 512, 1, 1}, {32, 3, 512, 1, 1}, {64, 2, 512, 1, 1},
	{64, 2, 256, 2, 2},
}

func (k gemmKernel) name() string {
	if k.fg > 1 {
		return fmt.Sprintf("gemm_nvfp4_k%d_t%d_f%d", k.kc, k.bm, k.fg)
	}
	if k.kc > 128 {
		return fmt.Sprintf("gemm_nvfp4_k%d_t%d", k.kc, k.bm)
	}
	return fmt.Sprintf("gemm_nvfp4_t%d", k.bm)
}

// shared is the ring's shared memory: per stage 128 features' kc/2 weight
// and kc/16 scale bytes, bm tokens' xrow x 16 bytes of x.
func (k gemmKernel) shared() int {
	xrow := 16*k.kc/128 + 4
	return k.ns * (128*k.kc/2 + 128*k.kc/16 + k.bm*xrow*16)
}

// gemmSplits is how many ways K (in stages) is split so that the blocks
// fill the multiprocessors (slots of them) without a second wave, with at
// least minStages each; cps is the stages per split.
func gemmSplits(tiles, stages, slots, minStages int) (splits, cps int) {
	splits = max(1, min(slots/tiles, stages/minStages))
	cps = (stages + splits - 1) / splits
	return (stages + cps - 1) / cps, cps
}

// gemmNVFP4 queues dst[m, N] = x[m, K]·wᵀ (+ bias) for an NVFP4 weight
// with K % 128 == 0 and x 16-byte aligned: gemm_x_h8, then gemm_nvfp4_t*
// (gemm.cuh).
func (b *Backend) gemmNVFP4(dst, x *Buffer, w *Weight, m int) {
	N, K := w.rows, w.cols
	k := gemmPick(m, N, K, b.sms, b.force.gemmK128, b.force.gemmK256)
	if f := b.force.gemmTile; f != "" {
		i := slices.IndexFunc(gemmKernels, func(g gemmKernel) bool { return g.name() == f })
		if i < 0 || K%gemmKernels[i].kc != 0 {
			b.setErr(fmt.Errorf("kernels: forced NVFP4 GEMM %q: no such variant for K = %d", f, K))
			return
		}
		k = gemmKernels[i]
	}
	bm := k.bm
	mtiles, ntiles := (m+bm-1)/bm, (N+127)/128
	splits, cps := gemmSplits(mtiles*ntiles, K/k.kc, k.occ*b.sms, 512/k.kc)
	b.partMu.Lock()
	s := &b.gemm
	err := b.grow(&s.xh, &s.xhLen, mtiles*bm*K/2) // fp16: K/2 words per token
	if err == nil && splits > 1 {
		if err = b.grow(&s.part, &s.partLen, mtiles*ntiles*splits*bm*128); err == nil {
			err = b.grow(&s.ticket, &s.ticketLen, mtiles*ntiles) // zeroed by alloc; each launch leaves it zero
		}
	}
	xh, part, ticket := s.xh, s.part, s.ticket
	b.partMu.Unlock()
	if err != nil {
		b.setErr(fmt.Errorf("kernels: NVFP4 matmul scratch for %d x %d, m = %d: %w", N, K, m, err))
		return
	}
	var pp, tp uint64
	if splits > 1 {
		pp, tp = part.ptr, ticket.ptr
	}
	bias := uint64(0)
	if w.bias != nil {
		bias = w.bias.ptr
	}
	units := mtiles * bm * K / 8
	conv := b.kernelOp("gemm_x_h8", b.elementGrid(units), 256, 0, xh.ptr, x.ptr, m, mtiles*bm, K)
	mm := b.kernelOp(k.name(), [3]int{ntiles * splits, mtiles, 1}, 256/k.fg, k.shared(),
		w.data.ptr, w.scales.ptr, w.global*64, xh.ptr, dst.ptr, bias, pp, tp, N, K, m, cps)
	if conv.fn == 0 || mm.fn == 0 {
		return // b.function kept the error for Sync
	}
	held := gemmXHeld{x: x.ptr, xh: xh.ptr, m: m, rows: mtiles * bm, K: K}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	// The matmuls of one input in a row (q, k and v; gate and up) convert
	// it once: the fp16 copy the last one made is still there when
	// nothing was queued since it (nothing wrote x or the copy) and
	// nothing was run outside the queue (flushLocked forgets it).
	if held.at = b.pushes; b.gemmX != held || spanOf(dst).overlaps(spanOf(x)) || b.force.gemmXEvery {
		b.push(conv)
	}
	b.push(mm)
	b.q.keep = append(b.q.keep, xh, part, ticket, w, x, dst)
	b.gemmX = gemmXHeld{}
	if !spanOf(dst).overlaps(spanOf(x)) {
		held.at = b.pushes
		b.gemmX = held
	}
}

// gemmXHeld is the fp16 copy of x that the GEMM's scratch holds: of x
// (its device address), m rows padded to rows, K wide, at xh, made by
// the conversion queued before the GEMM that was the at'th operation
// pushed (Backend.pushes; the zero value: nothing known). qmu guards it.
type gemmXHeld struct {
	x, xh      uint64
	m, rows, K int
	at         uint64
}

// kernelOp is the op enqueue would push (b.function's lookup failing
// leaves fn 0 and the error kept for Sync).
func (b *Backend) kernelOp(name string, grid [3]int, block, shared int, args ...any) op {
	o := op{kind: opKernel, name: name, fn: b.function(name),
		grid:  [3]uint32{uint32(grid[0]), uint32(max(grid[1], 1)), uint32(max(grid[2], 1))},
		block: uint32(block), shared: uint32(shared)}
	o.pdl = pdlKernel(name)
	o.setParams(args...)
	return o
}
