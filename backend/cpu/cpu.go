// Package cpu is the pure-Go compute backend: the reference and fallback for
// every operation of backend.Backend, parallel over all cores.
//
// Buffers are plain []float32 slices; weights keep their stored format (f32 and
// bf16 weights are used in place, straight from the checkpoint's memory map,
// NVFP4 weights are decoded block by block inside the matmul). The package owns
// the CPU kernels only; it reads no files and knows no model architecture.
// Its inner loops have assembly versions for amd64 (AVX2, AVX-512 VNNI) and
// arm64 (NEON, SDOT), chosen at start-up from the processor's features
// (*_amd64.s, *_arm64.s), and portable Go versions the tests hold them to.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

// Backend is the CPU backend. The zero value is not usable: call New.
type Backend struct {
	threads int
	opt     Options
	copied  atomic.Int64 // bytes of bf16 weights copied into huge pages
	pool    *pool        // the helper goroutines of parallel and parallelDynamic
	scratch sync.Pool    // *[]float32 (floats)

	// trace, where not nil (tests), sees each fan-out's units of work and
	// the goroutines it uses, the caller's included (1 and 1: serial).
	trace func(fanOutTrace)
}

// Options are the CPU backend's settings; the zero value is the default.
type Options struct {
	// Threads is the number of goroutines per operation (0: one per core).
	Threads int
	// ReferenceNVFP4 keeps NVFP4 matmuls on the float32 reference kernels
	// (quant.NVFP4.MatMulRows) instead of the int8-activation ones; for
	// tests and accuracy comparisons.
	ReferenceNVFP4 bool
	// MappedBF16 keeps bf16 weights as views of the uploaded bytes (the
	// checkpoint's file mapping: no copy, 4 KiB pages) instead of copies in
	// transparent huge pages (hugeBytes), which decode streams about 1.2x
	// faster. Copies stop at half the machine's memory (the rest stay
	// views), so that a checkpoint larger than memory still loads.
	MappedBF16 bool
}

// New returns a CPU backend that uses threads goroutines per operation
// (0: one per core) and the default options otherwise.
func New(threads int) *Backend { return NewWithOptions(Options{Threads: threads}) }

// NewWithOptions returns a CPU backend with the given options.
func NewWithOptions(o Options) *Backend {
	if o.Threads <= 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	b := &Backend{threads: o.Threads, opt: o, pool: newPool(o.Threads)}
	// A Backend dropped without Close stops its helpers when collected:
	// they reference the pool, never the Backend.
	runtime.AddCleanup(b, (*pool).close, b.pool)
	return b
}

var _ backend.Backend = (*Backend)(nil)

// Name reports the backend and its thread count.
func (b *Backend) Name() string { return fmt.Sprintf("cpu (%d threads)", b.threads) }

// Buffer is a CPU buffer: a float32 slice.
type Buffer []float32

// Len is the number of values.
func (x Buffer) Len() int { return len(x) }

// Data returns the host slice behind a buffer made by a CPU backend. It panics
// on another backend's buffer: that is a programming error.
func Data(b backend.Buffer) []float32 { return b.(Buffer) }

// NewBuffer allocates n zeroed values.
func (b *Backend) NewBuffer(n int) backend.Buffer { return make(Buffer, n) }

// View is b[off:off+n].
func (b *Backend) View(x backend.Buffer, off, n int) backend.Buffer {
	return x.(Buffer)[off : off+n : off+n]
}

// Write copies src into x at off.
func (b *Backend) Write(x backend.Buffer, off int, src []float32) { copy(x.(Buffer)[off:], src) }

// Read copies from x at off into dst.
func (b *Backend) Read(dst []float32, x backend.Buffer, off int) { copy(dst, x.(Buffer)[off:]) }

// Sync is a no-op: CPU operations complete before they return.
func (b *Backend) Sync() error { return nil }

// Close stops the pool's helper goroutines; operations after it still
// work, on goroutines started for each.
func (b *Backend) Close() error {
	b.pool.close()
	return nil
}

// parallel runs fn over [0, n) split into about b.threads runs of at least
// grain items each, which the calling goroutine and the pool's helpers
// claim in turn (pool.go).
func (b *Backend) parallel(n, grain int, fn func(lo, hi int)) {
	chunks := min(b.threads, (n+grain-1)/max(grain, 1))
	b.traceFanOut(0, max(chunks, 1), max(chunks, 1))
	if chunks <= 1 {
		fn(0, n)
		return
	}
	step := (n + chunks - 1) / chunks
	if b.pool.acquire() {
		b.pool.fanOut(phase{}, phase{n, step, fn}, chunks)
		return
	}
	b.goParallel(n, step, fn)
}

// goParallel is parallel on goroutines started for the call (the pool is
// taken): fn over [0, n) in runs of step items.
func (b *Backend) goParallel(n, step int, fn func(lo, hi int)) {
	var wg sync.WaitGroup
	for lo := step; lo < n; lo += step {
		hi := min(lo+step, n)
		wg.Go(func() { fn(lo, hi) })
	}
	fn(0, min(step, n))
	wg.Wait()
}

// parallelDynamic runs fn over [0, n) in chunks of chunk items (the last
// shorter) that up to b.threads goroutines, the caller one of them, take in
// turn from a shared counter until none is left: a thread slowed by
// another process (a shared machine) or a slower core takes fewer chunks
// instead of holding the others at the end, as parallel's equal shares do.
func (b *Backend) parallelDynamic(n, chunk int, fn func(lo, hi int)) {
	b.parallelDynamicAfter(phase{}, n, chunk, fn)
}

// parallelDynamicAfter is parallelDynamic after the phase pre (items of
// pre.step; none where pre.n is 0), all of pre done before any of fn, in
// one fan-out: the NVFP4 matmuls quantize their activations in pre.
func (b *Backend) parallelDynamicAfter(pre phase, n, chunk int, fn func(lo, hi int)) {
	chunk = max(chunk, 1)
	workers := min(b.threads, max((n+chunk-1)/chunk, pre.runs()))
	b.traceFanOut(pre.runs(), (n+chunk-1)/chunk, max(workers, 1))
	if workers <= 1 {
		if pre.n > 0 {
			pre.fn(0, pre.n)
		}
		fn(0, n)
		return
	}
	if b.pool.acquire() {
		b.pool.fanOut(pre, phase{n, chunk, fn}, workers)
		return
	}
	if pre.n > 0 {
		b.goParallel(pre.n, pre.step, pre.fn)
	}
	var next atomic.Int64
	work := func() {
		for {
			lo := int(next.Add(int64(chunk))) - chunk
			if lo >= n {
				return
			}
			fn(lo, min(lo+chunk, n))
		}
	}
	var wg sync.WaitGroup
	for range min(workers, (n+chunk-1)/chunk) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// traceFanOut reports a fan-out to b.trace (tests): its pre runs (of
// parallelDynamicAfter), its runs or chunks, and the goroutines it uses.
func (b *Backend) traceFanOut(pre, units, workers int) {
	if b.trace != nil {
		b.trace(fanOutTrace{pre, units, workers})
	}
}

// fanOutTrace is one fan-out, as b.trace sees it.
type fanOutTrace struct{ pre, units, workers int }

// floats returns scratch of n float32s, its contents undefined, kept
// between calls (Put it back into b.scratch): attention's scores, 4
// floats a position for each run of jobs, were allocated for each call,
// 64 MB a decode step of issue 61's model at 32k positions for the
// collector.
func (b *Backend) floats(n int) *[]float32 {
	if p, _ := b.scratch.Get().(*[]float32); p != nil && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

// dynamicChunk is parallelDynamic's chunk for n items over threads: about 4
// chunks a thread, at least grain items, a multiple of align.
func dynamicChunk(n, threads, grain, align int) int {
	c := max((n+4*threads-1)/(4*threads), grain, 1)
	return (c + align - 1) / align * align
}

// Weight is a weight on the CPU in its stored format.
type Weight struct {
	rows, cols int
	format     backend.Format
	f32        []float32 // F32 (and F16, widened at upload)
	bf16       []uint16  // BF16
	q          *quant.NVFP4
	dq         quant.RowDecoder // FP8Block, MXFP4 (fp8.go)
	q8         *q8Weight        // q repacked for the int8 kernels (nil: reference kernels)
	q16        *q16Weight       // q repacked for the AVX-512 VNNI kernels (instead of q8)
	bias       []float32
}

// Rows is the number of output features.
func (w *Weight) Rows() int { return w.rows }

// Cols is the number of input features.
func (w *Weight) Cols() int { return w.cols }

// Format is the storage format. F16 weights are widened to f32 at upload.
func (w *Weight) Format() backend.Format { return w.format }

// Upload wraps a host weight. F32 and BF16 data are used in place when aligned
// (the checkpoint's memory map, never written); F16 is widened to f32.
func (b *Backend) Upload(h *backend.HostWeight) (backend.Weight, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	w := &Weight{rows: h.Rows, cols: h.Cols, format: h.Format, bias: h.Bias}
	n := h.Rows * h.Cols
	switch h.Format {
	case backend.F32:
		if uintptr(unsafe.Pointer(&h.Data[0]))%4 == 0 {
			w.f32 = unsafe.Slice((*float32)(unsafe.Pointer(&h.Data[0])), n)
		} else {
			w.f32 = make([]float32, n)
			for i := range w.f32 {
				w.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(h.Data[4*i:]))
			}
		}
	case backend.F16:
		w.f32 = make([]float32, n)
		quant.DecodeF16(w.f32, h.Data)
		w.format = backend.F32
	case backend.BF16:
		if b.copyBF16(len(h.Data)) {
			// A copy in huge pages: the file's mapping has 4 KiB pages.
			hb := hugeBytes(len(h.Data))
			copy(hb, h.Data)
			w.bf16 = unsafe.Slice((*uint16)(unsafe.Pointer(&hb[0])), n)
		} else if uintptr(unsafe.Pointer(&h.Data[0]))%2 == 0 {
			w.bf16 = unsafe.Slice((*uint16)(unsafe.Pointer(&h.Data[0])), n)
		} else {
			w.bf16 = make([]uint16, n)
			for i := range w.bf16 {
				w.bf16[i] = uint16(h.Data[2*i]) | uint16(h.Data[2*i+1])<<8
			}
		}
	case backend.NVFP4:
		w.q = h.Q
		par := func(n int, fn func(lo, hi int)) { b.parallel(n, 64, fn) }
		switch {
		case b.opt.ReferenceNVFP4:
		case useQ16():
			w.q16 = newQ16Weight(h.Q, par)
		default:
			w.q8 = newQ8Weight(h.Q, par)
		}
	default:
		w.dq = decodedWeight(h)
	}
	return w, nil
}

// Embed gathers rows of the table as float32.
func (b *Backend) Embed(dst backend.Buffer, table backend.Weight, ids []int32) {
	t := table.(*Weight)
	out := dst.(Buffer)
	n := t.cols
	for i, id := range ids {
		row := out[i*n : (i+1)*n]
		switch {
		case t.f32 != nil:
			copy(row, t.f32[int(id)*n:])
		case t.dq != nil:
			t.dq.DequantizeRow(row, int(id))
		case t.bf16 != nil:
			src := t.bf16[int(id)*n : (int(id)+1)*n]
			for j, v := range src {
				row[j] = quant.BF16ToFloat32(v)
			}
		default:
			dequantizeRow(row, t.q, int(id))
		}
	}
}

// MatMul computes dst[m, rows] = x[m, cols] · wᵀ (+ bias), parallel over
// output features.
func (b *Backend) MatMul(dst, x backend.Buffer, wt backend.Weight, m int) {
	w := wt.(*Weight)
	out, in := dst.(Buffer), x.(Buffer)
	K, N := w.cols, w.rows
	switch {
	case w.q16 != nil:
		matmulRepacked(b, out, in, w, m, &w.q16.quadWeight, newQ16Act(w.q16.groups, m), &q16Kernels)
		return
	case w.q8 != nil:
		matmulRepacked(b, out, in, w, m, &w.q8.quadWeight, newQ8Act(w.q8.groups, m), &q8Kernels)
		return
	case m >= gemmMinRows && (w.f32 != nil || w.bf16 != nil):
		b.matmulGEMM(out, in, w, m)
		return
	}
	grain := max(1, (1<<16)/K) // at least ~64k weights per goroutine
	b.parallelDynamic(N, dynamicChunk(N, b.threads, grain, 1), func(lo, hi int) {
		switch {
		case w.f32 != nil:
			matmulF32(out, in, w.f32, m, K, N, lo, hi)
		case w.bf16 != nil && m == 1:
			matvecBF16(out[:N], in[:K], w.bf16, K, lo, hi)
		case w.bf16 != nil:
			matmulBF16(out, in, w.bf16, m, K, N, lo, hi)
		case w.dq != nil:
			matmulDecoded(out, in, w.dq, m, K, N, lo, hi)
		default:
			if m == 1 {
				w.q.MatVecRows(out[:N], in[:K], lo, hi)
			} else {
				w.q.MatMulRows(out, in, m, lo, hi)
			}
		}
		w.addBias(out, m, lo, hi)
	})
}

// addBias adds the bias (if any) to features [r0, r1) of the m rows of out.
func (w *Weight) addBias(out []float32, m, r0, r1 int) {
	if w.bias == nil {
		return
	}
	for i := range m {
		o := out[i*w.rows : (i+1)*w.rows]
		for r := r0; r < r1; r++ {
			o[r] += w.bias[r]
		}
	}
}

// RMSNorm normalizes rows of weight.Len() values.
func (b *Backend) RMSNorm(dst, x, weight backend.Buffer, eps float32) {
	d, xs, w := dst.(Buffer), x.(Buffer), weight.(Buffer)
	n := len(w)
	rows := len(xs) / n
	b.parallel(rows, max(1, 4096/n), func(lo, hi int) {
		layers.RMSNorm(d[lo*n:hi*n], xs[lo*n:hi*n], w, eps)
	})
}

// RoPE rotates in place.
func (b *Backend) RoPE(x backend.Buffer, rows, heads, stride, off, pos0 int, r *layers.RoPE, inverse bool) {
	xs := x.(Buffer)
	rowLen := heads * stride
	b.parallel(rows, 8, func(lo, hi int) {
		layers.ApplyRoPE(xs[lo*rowLen:hi*rowLen], hi-lo, heads, stride, off, pos0+lo, r, inverse)
	})
}

// SwiGLU computes silu(gate)*up.
func (b *Backend) SwiGLU(dst, gate, up backend.Buffer, limit float32) {
	d, g, u := dst.(Buffer), gate.(Buffer), up.(Buffer)
	b.parallel(len(d), swigluGrain(limit), func(lo, hi int) { swiglu(d[lo:hi], g[lo:hi], u[lo:hi], limit) })
}

// elementwiseGrain is the fewest elements a goroutine of Add and Scale
// takes: a prompt's residual adds (512 tokens x 2048) run on every thread,
// a decode step's (2048) on the caller alone. Serial, the prompt's adds
// were 0.7% of a one-thread prefill, a tenth of the time at 16 threads.
const elementwiseGrain = 1 << 15

// Add computes a + b.
func (b *Backend) Add(dst, x, y backend.Buffer) {
	d, xs, ys := dst.(Buffer), x.(Buffer), y.(Buffer)
	b.parallel(len(d), elementwiseGrain, func(lo, hi int) {
		d, xs, ys := d[lo:hi], xs[lo:hi], ys[lo:hi]
		for i := range d {
			d[i] = xs[i] + ys[i]
		}
	})
}

// Scale computes a * s.
func (b *Backend) Scale(dst, x backend.Buffer, s float32) {
	d, xs := dst.(Buffer), x.(Buffer)
	b.parallel(len(d), elementwiseGrain, func(lo, hi int) {
		d, xs := d[lo:hi], xs[lo:hi]
		for i := range d {
			d[i] = xs[i] * s
		}
	})
}

// Copy copies src into dst.
func (b *Backend) Copy(dst, src backend.Buffer) { copy(dst.(Buffer), src.(Buffer)) }

// dequantizeRow decodes row r of an NVFP4 matrix (element 2i in the low nibble
// of byte i, as ModelOpt packs them).
func dequantizeRow(dst []float32, q *quant.NVFP4, r int) {
	K := q.Cols
	packed := q.Packed[r*K/2 : (r+1)*K/2]
	scales := q.Scales[r*K/16 : (r+1)*K/16]
	for j := 0; j < K; j++ {
		c := packed[j/2] >> (4 * (j & 1))
		dst[j] = quant.E2M1ToFloat32(c&0xf) * quant.E4M3ToFloat32(scales[j/16]) * q.GlobalScale
	}
}

// GatherRows copies rows of src into dst.
func (b *Backend) GatherRows(dst, src backend.Buffer, rows []int32, w int) {
	d, s := dst.(Buffer), src.(Buffer)
	for i, r := range rows {
		copy(d[i*w:(i+1)*w], s[int(r)*w:(int(r)+1)*w])
	}
}

// ScatterAddRows adds scaled rows of src into rows of dst.
func (b *Backend) ScatterAddRows(dst, src backend.Buffer, rows []int32, scale []float32, w int) {
	d, s := dst.(Buffer), src.(Buffer)
	for i, r := range rows {
		o := d[int(r)*w : (int(r)+1)*w]
		axpyF32(o, s[i*w:(i+1)*w], scale[i])
	}
}

// copyBF16 says whether a bf16 weight of n bytes is copied into huge pages
// (Options.MappedBF16), and counts it.
func (b *Backend) copyBF16(n int) bool {
	if b.opt.MappedBF16 || !hugePages || n < hugeMin {
		return false
	}
	if b.copied.Add(int64(n)) > b.MemoryBytes()/2 {
		b.copied.Add(-int64(n))
		return false
	}
	return true
}
