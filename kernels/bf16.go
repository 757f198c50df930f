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
	b.launch(conv, [3]int{max(1, min((units+255)/256, 4*b.sms)), 1, 1}, 256, 0, xh.ptr, x.ptr, units)
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
