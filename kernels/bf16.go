package kernels

import "fmt"

// g16Scratch is the 16-bit GEMM's device memory (bf16.cuh), grown as needed
// and shared by its launches (which run one after another on the stream): x
// split into two 16-bit parts, the split partials and the tickets (zero
// between launches).
type g16Scratch struct {
	xh, part, ticket          *allocation
	xhLen, partLen, ticketLen int
}

// g16Kernel is one of bf16.cuh's gemm16 variants: its token tile (bt), warps
// along the features and the tokens (wf, wt), elements of K per stage (bk),
// ring stages (ns) and blocks per multiprocessor (occ), as its GEMM16_TILE
// line declares them.
type g16Kernel struct{ bt, wf, wt, bk, ns, occ int }

// g16Kernels are the token tiles, smallest first.
func g16Kernels() [4]g16Kernel {
	return [4]g16Kernel{
		{16, 8, 1, 64, 4, 2},
		{32, 4, 2, 64, 4, 2},
		{64, 4, 2, 32, 4, 2},
		{128, 2, 4, 32, 3, 2},
	}
}

// g16MinM is the smallest m the 16-bit matmul takes to the tensor cores:
// below it gemv_bf16_u4 reads each weight once per 4 tokens, as the GEMM's
// tiles do once per tile.
const g16MinM = 5

// g16SplitK is the fewest elements of K a split of the 16-bit GEMM takes.
const g16SplitK = 512

// g16Pick picks the variant for m tokens: the smallest token tile that
// holds m, or the largest (the grid is then filled by splitting K, gemm16).
// force (tests and benchmarks) picks tile bt where it is > 0.
func g16Pick(m, force int) g16Kernel {
	ks := g16Kernels()
	for _, k := range ks {
		if force > 0 && k.bt == force || force <= 0 && k.bt >= m {
			return k
		}
	}
	return ks[len(ks)-1]
}

func (k g16Kernel) name(f16 bool) string {
	if f16 {
		return fmt.Sprintf("gemm16_f16_t%d", k.bt)
	}
	return fmt.Sprintf("gemm16_bf16_t%d", k.bt)
}

// threads is the block size.
func (k g16Kernel) threads() int { return 32 * k.wf * k.wt }

// shared is the ring's shared memory: per stage 128 weight rows and 2 bt
// token rows (hi and lo parts) of bk + 8 16-bit values.
func (k g16Kernel) shared() int { return k.ns * (128 + 2*k.bt) * (k.bk + 8) * 2 }

// g16Eligible reports whether the 16-bit GEMM takes dst = x·wᵀ of m rows:
// m >= g16MinM (gemv_bf16_u4 below, unless force asks for the GEMM), K % 8 ==
// 0 and x 16-byte aligned (whole 16-byte rows of 8 values).
func g16Eligible(x *Buffer, w *Weight, m int, force bool) bool {
	return (m >= g16MinM || force) && w.cols%8 == 0 && x.ptr%16 == 0
}

// gemm16 queues dst[m, N] = x[m, K]·wᵀ (+ bias) for a bf16 weight (or, with
// f16, one stored in f16) with K % 8 == 0 and x 16-byte aligned:
// gemm16_x_*, then gemm16_*_t* (bf16.cuh).
func (b *Backend) gemm16(dst, x *Buffer, w *Weight, m int, f16 bool) {
	N, K := w.rows, w.cols
	k := g16Pick(m, b.force.g16Tile)
	mtiles, ntiles := (m+k.bt-1)/k.bt, (N+127)/128
	stages := (K + k.bk - 1) / k.bk
	splits, cps := gemmSplits(mtiles*ntiles, stages, k.occ*b.sms, max(1, g16SplitK/k.bk))
	if b.force.g16Splits > 0 {
		cps = (stages + b.force.g16Splits - 1) / b.force.g16Splits
		splits = (stages + cps - 1) / cps
	}
	b.partMu.Lock()
	s := &b.g16
	err := b.grow(&s.xh, &s.xhLen, m*K) // two 16-bit parts a value: words
	if err == nil && splits > 1 {
		if err = b.grow(&s.part, &s.partLen, mtiles*ntiles*splits*k.bt*128); err == nil {
			err = b.grow(&s.ticket, &s.ticketLen, mtiles*ntiles) // zeroed by alloc; each launch leaves it zero
		}
	}
	xh, part, ticket := s.xh, s.part, s.ticket
	b.partMu.Unlock()
	if err != nil {
		b.setErr(fmt.Errorf("kernels: 16-bit matmul scratch for %d x %d, m = %d: %w", N, K, m, err))
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
	units := m * K / 8
	conv := "gemm16_x_bf16"
	if f16 {
		conv = "gemm16_x_f16"
	}
	b.launch(conv, b.elementGrid(units), 256, 0, xh.ptr, x.ptr, units)
	name, shared := k.name(f16), k.shared()
	if !f16 && b.exp.gemm16Hi() {
		name, shared = name+"_hi", k.ns*(128+k.bt)*(k.bk+8)*2
	}
	b.launch(name, [3]int{ntiles * splits, mtiles, 1}, k.threads(), shared,
		w.data.ptr, xh.ptr, dst.ptr, bias, pp, tp, N, K, m, cps)
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, xh, part, ticket, w, x, dst)
	b.qmu.Unlock()
}

// g16vFns are the handles of the joined bf16 matvec kernels (bf16.cuh),
// looked up before a matvec is queued and read when it is finalized (both
// with qmu held).
type g16vFns struct{ grp, glu uintptr }

// gemv16Lone is the kernel and grid of a bf16 matvec of N rows that nothing
// joined: a warp a row with one load in flight a lane, four on tall
// matrices (the LM head: 100% of the copy rate against 90%) and for m > 1;
// at m = 1 on the 4096/14336 shapes one load measured faster
// (docs/PERFORMANCE.md). Few rows (the MoE routers; up to 1056 on an H100,
// where a warp a row would leave multiprocessors without a block): a block
// a row.
func (b *Backend) gemv16Lone(N, m int) (string, int) {
	if N <= 8*b.sms && m <= 4 {
		return "gemv_bf16_sk", N
	}
	if N >= 32768 || m > 1 {
		return "gemv_bf16_u4", (N + 7) / 8
	}
	return "gemv_bf16", (N + 7) / 8
}

// gemv16Eligible reports whether a bf16 matvec of m rows is queued as one
// the fusion pass may join (queueGemv16): K % 8 == 0, x 16-byte aligned,
// the buffers as large as the shapes, no kernel forced.
func (b *Backend) gemv16Eligible(dst, x *Buffer, w *Weight, m int) bool {
	return b.force.bf16Kernel == "" && w.cols%8 == 0 && x.ptr%16 == 0 && dst.ptr%4 == 0 &&
		x.n >= m*w.cols && dst.n >= m*w.rows
}

// queueGemv16 queues dst = x·wᵀ (+ bias) for a bf16 weight as the NVFP4
// matvecs are queued (fuse.go: queueGemv), so that the fusion pass joins
// it: with a queued bf16 matvec of the same x (q, k and v: one launch of
// gemv_bf16_grp), and then with the SwiGLU (gate and up: gemv_bf16_glu) or
// the residual add (gemv_bf16_grp with res) that follows it. One that
// nothing joins launches the kernel gemv16Lone picks.
func (b *Backend) queueGemv16(dst, x *Buffer, w *Weight, m int) {
	name, grid := b.gemv16Lone(w.rows, m)
	fn, grp, glu := b.function(name), b.function("gemv_bf16_grp"), b.function("gemv_bf16_glu")
	if fn == 0 || grp == 0 || glu == 0 {
		return // b.function kept the error for Sync
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.g16v = g16vFns{grp, glu}
	xs, y, bias := b.keepGemv(dst, x, w, m)
	if b.joinQueued(xs, y, func(g *gemvOp) bool { return joinGroup(g, xs, y, w, bias, m) }) {
		return
	}
	b.push(op{kind: opKernel, name: name, fn: fn, pdl: pdlKernel(name), grid: [3]uint32{uint32(grid), 1, 1}, block: 256,
		gemv: &gemvOp{x: xs, m: m, K: w.cols, groups: []gemvGroup{{w: w, y: y, bias: bias}}}})
}

// finalizeGemv16 fills in the parameters of a queued bf16 matvec, and the
// kernel and launch shape of a joined one. qmu held.
func (b *Backend) finalizeGemv16(o *op) {
	g := o.gemv
	gs := g.groups
	if len(gs) == 1 && g.mode == 0 { // kernel and grid as queued
		o.setParams(gs[0].w.data.ptr, g.x.ptr, gs[0].y.ptr, gs[0].bias, gs[0].w.rows, g.K, g.m)
		return
	}
	var W, y, bias [3]uint64
	var N [3]int
	for i, gg := range gs {
		W[i], y[i], bias[i], N[i] = gg.w.data.ptr, gg.y.ptr, gg.bias, gg.w.rows
	}
	rows := N[0] + N[1] + N[2]
	o.name, o.fn = "gemv_bf16_grp", b.g16v.grp
	if g.mode == 1 {
		o.name, o.fn, rows = "gemv_bf16_glu", b.g16v.glu, N[0]
	}
	res := uint64(0)
	if g.mode == 2 {
		res = g.res.ptr
	}
	o.pdl = pdlKernel(o.name)
	o.grid = [3]uint32{uint32((rows + 7) / 8), 1, 1}
	o.block, o.shared = 256, 0
	o.setParams(W[0], W[1], W[2], y[0], y[1], y[2], bias[0], bias[1], bias[2], N[0], N[1], N[2], g.x.ptr, res, g.K, g.m, g.limit)
}
