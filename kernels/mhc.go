package kernels

import (
	"fmt"
	"math"
	"runtime"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// The hyper-connection steps of layers/mhc on the GPU (backend.HyperConnectionOps), kernels in
// mhc.cuh. ops_test.go holds each to the CPU backend.

var (
	_ backend.HyperConnectionOps      = (*Backend)(nil)
	_ backend.FusedHyperConnectionOps = (*Backend)(nil)
)

// mhcFinishThreads is MHC_FT of mhc.cuh: mhc_proj_finish's block (a block
// per token).
const mhcFinishThreads = 128

// mhcMaxStreams is MHC_MAXN of mhc.cuh: the most streams the kernels take.
const mhcMaxStreams = 16

// MHCProject is the projection with each row's scale by 1/rms of the stream:
// for f32 and bf16 weights of up to 32 rows the fused kernels (mhc.cuh:
// mhc_proj_part over K slices, then mhc_proj_finish), else a MatMul followed
// by mhc_rowscale.
func (b *Backend) MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, normEps float32) {
	if rows <= 0 {
		return
	}
	p, ok := b.mhcProjPart(x, fn, rows, nil)
	if !ok {
		b.MatMul(logits, x, fn, rows)
		b.launch("mhc_rowscale", [3]int{rows, 1, 1}, 256, 0, ptr(logits), ptr(x), fn.Cols(), fn.Rows(), normEps)
		return
	}
	b.launch("mhc_proj_finish", [3]int{rows, 1, 1}, mhcFinishThreads, 0, ptr(logits), p.part, rows, p.mix, p.slices, p.k, normEps)
	runtime.KeepAlive(p.alloc)
}

// mhcProjMaxMix is 8*MHC_PMAXNT of mhc.cuh: the most weight rows the fused
// projection takes.
const mhcProjMaxMix = 32

// mhcProjKS caps the K slice of mhc_proj_part: it keeps the partial sums
// (slices x rows x (mix+1) floats) near 2% of the stream's bytes per side.
const mhcProjKS = 1024

// mhcProjRing is the bytes of mhc_proj_part's rings of x chunks: 8 warps x
// MHC_PSTAGES x MHC_PSLOT floats.
const mhcProjRing = 8 * 4 * 512 * 4

// mhcProjShare is the shared memory one mhc_proj_part block may take, so
// that two blocks fit on a multiprocessor (228 KiB, 1 KiB reserved each).
const mhcProjShare = 110 * 1024

// mhcProjPlan is a launch of mhc_proj_part: its grid, arguments and where
// its partial sums [slices, rows, mix+1] went.
type mhcProjPlan struct {
	part       uint64
	alloc      *allocation
	mix, k     int
	slices, ty int
}

// mhcProjPlanShape picks the K slice ks (a multiple of 64), the warps'
// split wt (token groups of 16 per block; 8/wt warps share the K slice) and
// the grid's rows ty (block (s, y) takes the tiles of 16*wt tokens y, y +
// ty, ...) for rows tokens of width k and mix outputs with elem-byte
// weights, and the block's shared memory. Past 64 tokens (wt = 8) the grid
// is one wave of at most two blocks per multiprocessor, each keeping its
// weight slice for all its tiles, and (ks, ty) minimize the columns the
// busiest block runs (tiles per block x ks; the wider slice on ties). ok is
// false if no slice fits in share bytes.
func mhcProjPlanShape(rows, k, mix, elem, sms, share int) (ks, wt, ty, shared int, ok bool) {
	wt = 8
	switch {
	case rows <= 16:
		wt = 1
	case rows <= 32:
		wt = 2
	case rows <= 64:
		wt = 4
	}
	npad := (mix + 7) &^ 7
	// After the weights: the warps' rings of x chunks, whose place the
	// warps' sums take at the end.
	after := max(mhcProjRing, 8*16*(npad+1)*4)
	maxKS := ((share-after)/(npad*elem) - 16) &^ 63
	maxKS = min(maxKS, mhcProjKS, (k+63)&^63)
	if maxKS < 64 {
		return 0, 0, 0, 0, false
	}
	tiles := (rows + 16*wt - 1) / (16 * wt)
	slots := 2 * max(sms, 1)
	ks, ty = maxKS, 1
	if tiles == 1 {
		// Enough slices for two blocks per multiprocessor; at least a
		// 32-wide chunk per warp of a K group.
		ks = ((k+slots-1)/slots + 63) &^ 63
		ks = min(max(ks, 32*(8/wt), 64), maxKS)
	} else {
		best := -1
		for c := 64; c <= maxKS; c += 64 {
			slices := (k + c - 1) / c
			if slices > slots {
				continue
			}
			y := min(tiles, slots/slices)
			if cost := (tiles + y - 1) / y * c; best < 0 || cost <= best {
				best, ks, ty = cost, c, y
			}
		}
	}
	return ks, wt, ty, npad*(ks+16)*elem + after, true
}

// mhcTail is the rest of MHCCoeffsPre run by mhc_proj_part's last block
// (mhc.cuh: MhcTail): the logits, the coefficients and pre's output.
type mhcTail struct {
	logits, pre, post, res, dst, base, scale backend.Buffer
	n, hidden, iters                         int
	eps, normEps                             float32
}

// mhcTailRows is the most tokens mhc_proj_part finishes itself (the kernel
// takes up to 16: 16 lanes a token in its last block). Its last block sums
// the slices token by token and runs pre alone, so the split path wins from
// a few tokens: MHCCoeffsPre at n = 4, C = 7168 (BenchmarkOpsFloorMHC,
// coeffs+pre-op against coeffs+pre) measured 15-17 against 25 us at B = 1,
// 19-20 against 24-25 at B = 2 and 27 against 22-24 at B = 4.
const mhcTailRows = 2

// slots is the tail as MhcTail's 8-byte slots (nil: no tail, a null ticket).
func (t *mhcTail) slots(ticket uint64) []uint64 {
	if t == nil {
		return make([]uint64, 11)
	}
	return []uint64{ticket, ptr(t.logits), ptr(t.pre), ptr(t.post), ptr(t.res), ptr(t.dst), ptr(t.base), ptr(t.scale),
		uint64(uint32(t.n)) | uint64(uint32(t.hidden))<<32, uint64(uint32(t.iters)) | uint64(math.Float32bits(t.eps))<<32,
		uint64(math.Float32bits(t.normEps))}
}

// mhcProjPart queues mhc_proj_part for rows tokens of x against fn, with
// tail (non-nil) finishing MHCCoeffsPre in its last block; ok is false where
// the fused kernels do not apply (weight format, mix > 32, shared memory)
// and nothing was queued.
func (b *Backend) mhcProjPart(x backend.Buffer, fn backend.Weight, rows int, tail *mhcTail) (mhcProjPlan, bool) {
	w := fn.(*Weight)
	mix, k := w.rows, w.cols
	if mix < 1 || mix > mhcProjMaxMix || k < 1 {
		return mhcProjPlan{}, false
	}
	var name string
	elem := 4
	switch w.format {
	case backend.F32:
		name = "mhc_proj_part_f32"
	case backend.BF16:
		name, elem = "mhc_proj_part_bf16", 2
	default:
		return mhcProjPlan{}, false
	}
	ks, wt, ty, shared, ok := mhcProjPlanShape(rows, k, mix, elem, b.sms, min(b.opsShare(), mhcProjShare))
	if !ok {
		return mhcProjPlan{}, false
	}
	if k%8 == 0 && ptr(x)%16 == 0 {
		name += "_v" // 16-byte loads of x and fn
	}
	p := mhcProjPlan{mix: mix, k: k, slices: (k + ks - 1) / ks, ty: ty}
	// The partial sums share attention_kv's split scratch: both are consumed
	// by the next kernel in the stream.
	// The tail's ticket is attn_decode's first: each kernel takes and resets
	// it after its wait for the kernel before, so no two use it at once.
	need := p.slices * rows * (mix + 1)
	part, ticket, err := b.attnScratch(need, boolInt(tail != nil))
	if err != nil {
		b.setErr(err)
		return mhcProjPlan{}, false
	}
	p.alloc = part
	p.part = p.alloc.ptr
	tslots := tail.slots(0)
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, p.alloc, w)
	if tail != nil {
		b.q.keep = append(b.q.keep, ticket, tail.logits, tail.pre, tail.post, tail.res, tail.dst, tail.base, tail.scale)
		tslots = tail.slots(ticket.ptr)
	}
	b.qmu.Unlock()
	b.launch(name, [3]int{p.slices, p.ty, 1}, 256, shared, p.part, ptr(x), w.data.ptr, rows, k, mix, ks, wt, tslots)
	runtime.KeepAlive(w)
	return p, true
}

// MHCCoeffsPre is backend.FusedHyperConnectionOps: MHCProject (the fused projection's partial
// sums and mhc_proj_finish), MHCActivate and MHCPre, after checking the
// weight against the mixer. For up to mhcTailRows tokens (decode) the last
// block of the projection runs the other three steps itself (mhcTail): one
// launch instead of four. Seed 000's one-pass kernel measured slower than
// the split path at every B (docs/DECISIONS.md).
func (b *Backend) MHCCoeffsPre(m *mhc.Mixer, dst, pre, post, res, logits, x backend.Buffer, fn backend.Weight,
	base, scale backend.Buffer, rows int) {
	c := m.Config()
	if fn.Rows() != c.MixDim() || fn.Cols() != c.Width() {
		b.setErr(fmt.Errorf("kernels: mHC projection weight [%d, %d], want [%d, %d] (MixDim, n*C)", fn.Rows(), fn.Cols(), c.MixDim(), c.Width()))
		return
	}
	if rows >= 1 && rows <= mhcTailRows && c.Residual != mhc.Lite && c.Streams <= 4 && c.Hidden%4 == 0 &&
		(ptr(dst)|ptr(x))%16 == 0 && !b.force.mhcTailOff {
		t := &mhcTail{logits: logits, pre: pre, post: post, res: res, dst: dst, base: base, scale: scale,
			n: c.Streams, hidden: c.Hidden, iters: c.SinkhornIters, eps: c.Eps, normEps: c.NormEps}
		if _, ok := b.mhcProjPart(x, fn, rows, t); ok {
			return
		}
	}
	b.MHCProject(logits, x, fn, rows, c.NormEps)
	b.MHCActivate(m, pre, post, res, logits, base, scale, rows)
	b.MHCPre(dst, x, pre, rows, c.Streams, c.Hidden)
}

// MHCActivate turns the logits into pre, post and the residual matrix: 16
// lanes per token for Sinkhorn with n <= 4 (mhc_activate16), else one thread
// per token.
func (b *Backend) MHCActivate(m *mhc.Mixer, pre, post, res, logits, base, scale backend.Buffer, rows int) {
	c := m.Config()
	n := c.Streams
	if n < 1 || n > mhcMaxStreams {
		b.setErr(fmt.Errorf("kernels: mHC with %d streams: the kernels take 1 to %d", n, mhcMaxStreams))
		return
	}
	if rows <= 0 {
		return
	}
	if c.Residual != mhc.Lite && n <= 4 { // 16 lanes per token
		b.launch("mhc_activate16", grid1(16*rows, 128), 128, 0, ptr(pre), ptr(post), ptr(res), ptr(logits), ptr(base), ptr(scale),
			rows, n, c.SinkhornIters, c.Eps)
		return
	}
	lite := boolInt(c.Residual == mhc.Lite)
	b.launch("mhc_activate", grid1(rows, 64), 64, 0, ptr(pre), ptr(post), ptr(res), ptr(logits), ptr(base), ptr(scale),
		rows, n, c.SinkhornIters, c.Eps, lite, c.ResDim())
}

// MHCPre collapses the streams.
func (b *Backend) MHCPre(dst, x, pre backend.Buffer, rows, n, hidden int) {
	if rows*hidden <= 0 {
		return
	}
	if n <= mhcMaxStreams && hidden%4 == 0 && (ptr(dst)|ptr(x))%16 == 0 {
		b.launch("mhc_pre4", rowGrid(hidden/4, rows), 256, 0, ptr(dst), ptr(x), ptr(pre), rows, n, hidden)
		return
	}
	b.launch("mhc_pre", grid1(rows*hidden, 256), 256, 0, ptr(dst), ptr(x), ptr(pre), rows, n, hidden)
}

// MHCPost mixes the streams and adds the sub-layer output; dst may be x.
func (b *Backend) MHCPost(dst, x, out, post, res backend.Buffer, rows, n, hidden int) {
	if n < 1 || n > mhcMaxStreams {
		b.setErr(fmt.Errorf("kernels: mHC with %d streams: the kernels take 1 to %d", n, mhcMaxStreams))
		return
	}
	if rows*hidden <= 0 {
		return
	}
	if n <= 4 && hidden%4 == 0 && (ptr(dst)|ptr(x)|ptr(out))%16 == 0 {
		// Four columns per thread, 16-byte loads and stores.
		b.launch("mhc_post4", rowGrid(hidden/4, rows), 256, 0, ptr(dst), ptr(x), ptr(out), ptr(post), ptr(res), rows, n, hidden)
		return
	}
	b.launch("mhc_post", grid1(rows*hidden, 256), 256, 0, ptr(dst), ptr(x), ptr(out), ptr(post), ptr(res), rows, n, hidden)
}

// MHCHeadActivate turns hc_head logits into collapse weights in place.
func (b *Backend) MHCHeadActivate(pre, base backend.Buffer, scale, eps float32, rows, n int) {
	if rows*n <= 0 {
		return
	}
	b.launch("mhc_head_activate", grid1(rows*n, 256), 256, 0, ptr(pre), ptr(base), scale, eps, rows*n, n)
}

// MHCExpand copies each embedding into the n streams.
func (b *Backend) MHCExpand(dst, emb backend.Buffer, rows, n, hidden int) {
	if rows*n*hidden <= 0 {
		return
	}
	b.launch("mhc_expand", grid1(rows*n*hidden, 256), 256, 0, ptr(dst), ptr(emb), rows, n, hidden)
}

// rowGrid covers cols threads per row (256 to a block) over rows rows, a
// row per grid row, the kernel striding over rows past the grid's 65535.
func rowGrid(cols, rows int) [3]int {
	return [3]int{(cols + 255) / 256, min(rows, 65535), 1}
}
