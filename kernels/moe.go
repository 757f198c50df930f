package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// MoE on the device (backend.RoutedMoEOps for DeepSeek-V4,
// backend.GroupMoEOps for V3 and V3.2, backend.SoftmaxMoEOps for Qwen3-MoE),
// kernels in moe.cuh: the routing (moe_route, moe_group_route,
// moe_softmax_route) and the routed experts (moe_up: gate and up with
// SwiGLU; moe_down: down, weighted and added to the output) read the picked
// experts' weights through a table of the layer's experts, so nothing comes
// back to the host.

var (
	_ backend.RoutedMoEOps     = (*Backend)(nil)
	_ backend.DeviceHashMoEOps = (*Backend)(nil)
	_ backend.GroupMoEOps      = (*Backend)(nil)
	_ backend.SoftmaxMoEOps    = (*Backend)(nil)
)

// moe.cuh's limits: MOE_MAXK picks per token, MOE_MAXE experts, MOE_ROWS
// output rows per block, MOE_THREADS threads (MOE_RT: moe_route's warp).
const (
	moeMaxK     = 16
	moeMaxE     = 1024
	moeRows     = 16
	moeThreads  = 256
	moeRouteT   = 32
	moeTableRow = 64 // bytes of a MoeExpert
)

// moeExperts is a layer's routed experts on the device: the MoeExpert table
// (each expert's three weights' data, scales and global scale) and the
// router bias.
type moeExperts struct {
	table, bias *allocation
	n, ffn, dim int
	fp8         bool      // the experts are FP8 (moe_up_fp8, moe_down_fp8), not NVFP4
	bf16        bool      // the experts are bf16 (moe_up_bf16, moe_down_bf16), not NVFP4
	weights     []*Weight // what the table points into
}

func (x *moeExperts) NumExperts() int { return x.n }

// moeStaged is the floats moe_stage spans for a vector of k values.
func moeStaged(k int) int { return (k + 1023) / 1024 * 1024 }

// MaxDeviceMoETokens is 8: at more tokens a call, the host path, which
// reads each expert's weights once a chunk, beats the device path's once a
// token on the models measured (docs/DECISIONS.md).
func (b *Backend) MaxDeviceMoETokens() int { return 8 }

// BindExperts builds the expert table for NVFP4 experts, FP8 ones kept as
// FP8 on the device (fp8.go; moe_up_fp8, moe_down_fp8) or bf16 ones
// (moe_up_bf16, moe_down_bf16), all of one format, whose widths are
// multiples of 32 and whose staged inputs fit in shared memory; otherwise it
// returns nil, nil.
func (b *Backend) BindExperts(w1, w3, w2 []backend.Weight, bias []float32) (backend.Experts, error) {
	E := len(w1)
	if E == 0 || E > moeMaxE || len(w3) != E || len(w2) != E || (bias != nil && len(bias) != E) {
		return nil, nil
	}
	I, D := w1[0].Rows(), w1[0].Cols()
	if I%32 != 0 || D%32 != 0 || 4*moeStaged(D) > b.opsShare() || 4*moeStaged(I) > b.opsShare() {
		return nil, nil
	}
	x := &moeExperts{n: E, ffn: I, dim: D}
	format := backend.NVFP4
	if w, ok := w1[0].(*Weight); ok && (w.format == backend.FP8Block || w.format == backend.BF16) {
		format = w.format
	}
	x.fp8, x.bf16 = format == backend.FP8Block, format == backend.BF16
	table := make([]byte, E*moeTableRow)
	for e := range E {
		row := table[e*moeTableRow:]
		for j, wt := range []backend.Weight{w1[e], w3[e], w2[e]} {
			w, ok := wt.(*Weight)
			rows, cols := I, D
			if j == 2 {
				rows, cols = D, I
			}
			if !ok || w.format != format || w.rows != rows || w.cols != cols || w.bias != nil {
				return nil, nil
			}
			binary.LittleEndian.PutUint64(row[8*j:], w.data.ptr)
			if w.scales != nil { // (bf16 has none)
				binary.LittleEndian.PutUint64(row[24+8*j:], w.scales.ptr)
			}
			global := w.global
			if format != backend.NVFP4 {
				global = 1.0 / 16384 // the kernels' 2^14 (moe.cuh) then leaves the FP8 and bf16 sums as they are
			}
			binary.LittleEndian.PutUint32(row[48+4*j:], math.Float32bits(global))
			x.weights = append(x.weights, w)
		}
	}
	var err error
	if x.table, err = b.upload(table); err != nil {
		return nil, fmt.Errorf("kernels: MoE expert table: %w", err)
	}
	if bias != nil {
		if x.bias, err = b.upload(f32Bytes(bias)); err != nil {
			return nil, fmt.Errorf("kernels: MoE router bias: %w", err)
		}
	}
	return x, nil
}

// RoutedMoE queues moe_route, moe_up and moe_down (see moe.cuh). The picks and
// weights [M, K] and the activations [M, K, ffn] live in per-backend scratch.
func (b *Backend) RoutedMoE(out, x, logits backend.Buffer, hash []int32, exp backend.Experts, a dsv4.RouteArgs, limit float32) {
	if hash != nil && len(hash) != a.M*a.K {
		b.setErr(fmt.Errorf("kernels: MoE of %d tokens, top-%d: %d hashed ids", a.M, a.K, len(hash)))
		return
	}
	r, ok := b.moePrepare(exp, a.M, a.Experts, a.K)
	if !ok {
		return
	}
	b.qmu.Lock()
	hashPtr := uint64(0)
	if hash != nil { // the hashed ids travel in the queue's step values
		if hashPtr, ok = b.stepIDs(hash); !ok {
			b.qmu.Unlock()
			b.setErr(fmt.Errorf("kernels: MoE: %d hashed ids exceed the step values", len(hash)))
			return
		}
	}
	b.queueRoute(r, logits, hashPtr, a)
	b.q.keep = append(b.q.keep, out, x)
	b.qmu.Unlock()
	b.moeFFN(r, out, x, a.M, a.K, limit)
}

// RoutedMoEDeviceHash is RoutedMoE with the hashed picks read from hash on
// the device (backend.DeviceHashMoEOps): moe_route takes them from there
// instead of from the step values.
func (b *Backend) RoutedMoEDeviceHash(out, x, logits, hash backend.Buffer, exp backend.Experts, a dsv4.RouteArgs, limit float32) {
	if hash.Len() != a.M*a.K {
		b.setErr(fmt.Errorf("kernels: MoE of %d tokens, top-%d: a buffer of %d hashed ids", a.M, a.K, hash.Len()))
		return
	}
	r, ok := b.moePrepare(exp, a.M, a.Experts, a.K)
	if !ok {
		return
	}
	b.qmu.Lock()
	b.queueRoute(r, logits, ptr(hash), a)
	b.q.keep = append(b.q.keep, out, x, hash)
	b.qmu.Unlock()
	b.moeFFN(r, out, x, a.M, a.K, limit)
}

// queueRoute queues moe_route of r's tokens over logits, the hashed picks
// at the device address hash (0: none). qmu held.
func (b *Backend) queueRoute(r moeRun, logits backend.Buffer, hash uint64, a dsv4.RouteArgs) {
	b.q.keep = append(b.q.keep, r.ex, r.scratch, logits)
	o := op{kind: opKernel, name: "moe_route", fn: b.function("moe_route"), grid: [3]uint32{uint32(a.M), 1, 1}, block: moeRouteT}
	o.setParams(r.ids, r.wts, ptr(logits), r.bias(), hash, a.Experts, a.K, boolInt(a.Scoring == dsv4.ScoreSqrtSoftplus), a.Scale)
	b.push(o)
}

// GroupMoE is backend.GroupMoEOps: moe_group_route (layers.GroupRoute on
// the device), then moe_up and moe_down as MoE.
func (b *Backend) GroupMoE(out, x, logits backend.Buffer, exp backend.Experts, a layers.GroupRouteArgs) {
	if err := a.Validate(); err != nil {
		b.setErr(fmt.Errorf("kernels: %w", err))
		return
	}
	if a.Groups > moeMaxE/2 {
		b.setErr(fmt.Errorf("kernels: MoE of %d groups: the router takes at most %d", a.Groups, moeMaxE/2))
		return
	}
	r, ok := b.moePrepare(exp, a.M, a.Experts, a.K)
	if !ok {
		return
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, r.ex, r.scratch, out, x, logits)
	b.qmu.Unlock()
	b.launch("moe_group_route", [3]int{a.M, 1, 1}, moeRouteT, 0, r.ids, r.wts, ptr(logits), r.bias(),
		a.Experts, a.K, a.Groups, a.TopKGroups, boolInt(a.Normalize), a.Scale)
	b.moeFFN(r, out, x, a.M, a.K, 0)
}

// SoftmaxMoE is backend.SoftmaxMoEOps: moe_softmax_route
// (layers.SoftmaxRoute on the device), then moe_up and moe_down as MoE.
func (b *Backend) SoftmaxMoE(out, x, logits backend.Buffer, exp backend.Experts, a layers.SoftmaxRouteArgs) {
	if err := a.Validate(); err != nil {
		b.setErr(fmt.Errorf("kernels: %w", err))
		return
	}
	r, ok := b.moePrepare(exp, a.M, a.Experts, a.K)
	if !ok {
		return
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, r.ex, r.scratch, out, x, logits)
	b.qmu.Unlock()
	b.launch("moe_softmax_route", [3]int{a.M, 1, 1}, moeRouteT, 0, r.ids, r.wts, ptr(logits), a.Experts, a.K, boolInt(a.Normalize))
	b.moeFFN(r, out, x, a.M, a.K, 0)
}

// moeRun is one MoE call's experts and scratch: picks and weights [M, K],
// activations [M, K, ffn].
type moeRun struct {
	ex            *moeExperts
	scratch       *allocation
	ids, wts, act uint64
}

func (r moeRun) bias() uint64 {
	if r.ex.bias == nil {
		return 0
	}
	return r.ex.bias.ptr
}

// moePrepare checks a MoE call of m tokens, top-k of e experts, against the
// bound experts and takes its scratch; false (the error kept for Sync, or
// nothing to do) if the call cannot run.
func (b *Backend) moePrepare(exp backend.Experts, m, e, k int) (moeRun, bool) {
	ex, ok := exp.(*moeExperts)
	switch {
	case !ok:
		b.setErr(fmt.Errorf("kernels: MoE experts of type %T were not bound by this backend", exp))
		return moeRun{}, false
	case m <= 0:
		return moeRun{}, false
	case e != ex.n || k < 1 || k > min(moeMaxK, ex.n):
		b.setErr(fmt.Errorf("kernels: MoE of %d tokens, top-%d of %d experts (bound: %d)", m, k, e, ex.n))
		return moeRun{}, false
	case 4*k*moeStaged(ex.ffn) > b.opsShare():
		b.setErr(fmt.Errorf("kernels: MoE top-%d of width %d exceeds this GPU's shared memory", k, ex.ffn))
		return moeRun{}, false
	}
	pairs := m * k
	scratch, err := b.moeScratch(2*pairs + 4 + pairs*ex.ffn)
	if err != nil {
		b.setErr(err)
		return moeRun{}, false
	}
	r := moeRun{ex: ex, scratch: scratch, ids: scratch.ptr, wts: scratch.ptr + uint64(4*pairs)}
	r.act = (r.wts + uint64(4*pairs) + 15) &^ 15 // 16-byte aligned: moe_down stages it in float4
	// (the scratch is at least 256-byte aligned, as every allocation)
	return r, true
}

// moeFFN queues the routed experts' SwiGLU FFNs over the picks in r.
func (b *Backend) moeFFN(r moeRun, out, x backend.Buffer, m, k int, limit float32) {
	ex := r.ex
	up, down := "moe_up", "moe_down"
	switch {
	case ex.fp8:
		up, down = "moe_up_fp8", "moe_down_fp8"
	case ex.bf16:
		up, down = "moe_up_bf16", "moe_down_bf16"
	}
	b.launch(up, [3]int{(ex.ffn + moeRows - 1) / moeRows, m * k, 1}, moeThreads, 4*moeStaged(ex.dim),
		r.act, ptr(x), r.ids, ex.table.ptr, k, ex.ffn, ex.dim, limit)
	b.launch(down, [3]int{(ex.dim + moeRows - 1) / moeRows, m, 1}, moeThreads, 4*k*moeStaged(ex.ffn),
		ptr(out), r.act, r.ids, r.wts, ex.table.ptr, k, ex.ffn, ex.dim)
}

// moeScratch returns MoE's scratch (at least n floats), growing it as
// needed; a smaller one still queued stays alive through the queue's keep.
func (b *Backend) moeScratch(n int) (*allocation, error) {
	b.partMu.Lock()
	defer b.partMu.Unlock()
	if b.moeBufLen < n {
		a, err := b.alloc(4 * n)
		if err != nil {
			return nil, err
		}
		b.moeBuf, b.moeBufLen = a, n
	}
	return b.moeBuf, nil
}
