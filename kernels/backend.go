package kernels

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

// image is the kernels built by build.sh from manifold.cu: sm_90 machine
// code plus PTX that newer GPUs compile at load.
//
//go:embed manifold.fatbin
var image []byte

// Backend runs backend.Backend on one NVIDIA GPU. Methods may be called from
// several goroutines; work is queued on one stream, and the first error is
// kept and returned by Sync.
type Backend struct {
	d        *driver
	dev      int32
	ctx      uintptr
	stream   uintptr
	module   uintptr
	fn       map[string]uintptr
	name     string
	sms      int
	maxShare int // dynamic shared memory a block may use, bytes

	mu    sync.Mutex
	err   error
	ropes map[*layers.RoPE]*allocation

	profiling bool
	timed     []timedLaunch
	closed    bool
	live      map[uint64]struct{} // allocations not yet freed

	sampleMu sync.Mutex
	sample   sampler
}

var _ backend.Backend = (*Backend)(nil)

// Available reports whether a CUDA driver and at least one GPU are present.
func Available() bool {
	d, err := loadDriver()
	if err != nil {
		return false
	}
	var n int32
	return d.cuDeviceGetCount(&n) == 0 && n > 0
}

// New opens GPU ordinal and loads the kernels.
func New(ordinal int) (*Backend, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	img := image
	if path := os.Getenv("MANIFOLD_KERNEL_IMAGE"); path != "" {
		// For kernel development: try a freshly built image without rebuilding the Go binary.
		if img, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("kernels: MANIFOLD_KERNEL_IMAGE: %w", err)
		}
	}
	if len(img) == 0 {
		return nil, fmt.Errorf("kernels: this build embeds no kernel image (run kernels/build.sh on a machine with nvcc): %w", ErrNoDriver)
	}
	b := &Backend{d: d, fn: map[string]uintptr{}, live: map[uint64]struct{}{}}
	var n int32
	if err := d.check("cuDeviceGetCount", d.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	if int(n) <= ordinal {
		return nil, fmt.Errorf("kernels: GPU %d requested, %d present: %w", ordinal, n, ErrNoDriver)
	}
	if err := d.check("cuDeviceGet", d.cuDeviceGet(&b.dev, int32(ordinal))); err != nil {
		return nil, err
	}
	var nameBuf [256]byte
	d.cuDeviceGetName(&nameBuf[0], int32(len(nameBuf)), b.dev)
	b.name = goString(&nameBuf[0])
	var v int32
	d.cuDeviceGetAttribute(&v, 16, b.dev) // multiprocessor count
	b.sms = int(v)
	d.cuDeviceGetAttribute(&v, 97, b.dev) // max shared memory per block, opt-in
	b.maxShare = int(v) - 1024            // the kernels' static shared arrays
	if err := d.check("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(&b.ctx, b.dev)); err != nil {
		return nil, err
	}
	d.onContext(b.ctx, func() {
		if err = d.check("cuStreamCreate", d.cuStreamCreate(&b.stream, 0)); err != nil {
			return
		}
		if err = d.check("cuModuleLoadData", d.cuModuleLoadData(&b.module, unsafe.Pointer(&img[0]))); err != nil {
			return
		}
		for _, name := range []string{"gemv_f32", "gemv_bf16", "gemm_nvfp4_mma", "gemv_f32_any", "gemv_bf16_any",
			"gemv_nvfp4_any", "embed", "rmsnorm", "rope", "attention", "swiglu", "add", "scale",
			"sample_partial", "sample_final"} {
			var f uintptr
			if err = d.check("cuModuleGetFunction "+name, d.cuModuleGetFunction(&f, b.module, cString(name))); err != nil {
				return
			}
			b.fn[name] = f
		}
		// Dynamic shared memory past the default 48 KB must be asked for.
		for name, bytes := range map[string]int{"attention": b.maxShare, "sample_final": sampleFinalShared} {
			if err = d.check("cuFuncSetAttribute "+name, d.cuFuncSetAttribute(b.fn[name], 8, int32(bytes))); err != nil {
				return
			}
		}
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Name is "cuda: <GPU name>".
func (b *Backend) Name() string { return "cuda: " + b.name }

func (b *Backend) setErr(err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	if b.err == nil {
		b.err = err
	}
	b.mu.Unlock()
}

// Sync waits for queued work and returns the first error seen since the last Sync.
func (b *Backend) Sync() error {
	b.d.onContext(b.ctx, func() { b.setErr(b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream))) })
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.err
	b.err = nil
	return err
}

// Close frees the stream, the module and the context reference; with the
// last reference the driver frees every allocation of the context.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	var errs []error
	b.d.onContext(b.ctx, func() {
		if b.stream != 0 {
			errs = append(errs, b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream)))
			b.d.cuStreamDestroy(b.stream)
			b.stream = 0
		}
		if b.module != 0 {
			b.d.cuModuleUnload(b.module)
			b.module = 0
		}
		for p := range b.live {
			b.d.cuMemFree(p)
		}
		b.live = nil
	})
	if b.ctx != 0 {
		b.d.cuDevicePrimaryCtxRelease(b.dev)
		b.ctx = 0
	}
	return errors.Join(errs...)
}

// ---------------------------------------------------------------------------
// Memory.

// allocation is one cuMemAlloc; it is freed when no buffer refers to it.
type allocation struct{ ptr uint64 }

// Buffer is a window of float32 values in device memory.
type Buffer struct {
	a   *allocation
	ptr uint64
	n   int
}

// Len is the number of values.
func (x *Buffer) Len() int { return x.n }

func (b *Backend) alloc(bytes int) (*allocation, error) {
	a := &allocation{}
	var err error
	b.d.onContext(b.ctx, func() {
		err = b.d.check(fmt.Sprintf("cuMemAlloc(%d bytes)", bytes), b.d.cuMemAlloc(&a.ptr, uintptr(max(bytes, 4))))
		if err == nil {
			err = b.d.check("cuMemsetD32", b.d.cuMemsetD32Async(a.ptr, 0, uintptr(max(bytes, 4)/4), b.stream))
		}
	})
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.live[a.ptr] = struct{}{}
	b.mu.Unlock()
	runtime.AddCleanup(a, b.free, a.ptr)
	return a, nil
}

// free returns device memory once nothing refers to it. Close frees what is
// still live; after it, an address may belong to another allocation, so
// nothing more is freed here.
func (b *Backend) free(ptr uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	delete(b.live, ptr)
	b.d.onContext(b.ctx, func() { b.d.cuMemFree(ptr) })
}

// NewBuffer allocates n zeroed float32 values. An allocation failure is kept
// for Sync and yields an empty buffer.
func (b *Backend) NewBuffer(n int) backend.Buffer {
	a, err := b.alloc(4 * n)
	if err != nil {
		b.setErr(err)
		return &Buffer{n: 0}
	}
	return &Buffer{a: a, ptr: a.ptr, n: n}
}

// View is the window [off, off+n) of x.
func (b *Backend) View(x backend.Buffer, off, n int) backend.Buffer {
	xb := x.(*Buffer)
	if off < 0 || n < 0 || off+n > xb.n {
		panic(fmt.Sprintf("kernels: view [%d, %d) of a buffer of %d", off, off+n, xb.n))
	}
	return &Buffer{a: xb.a, ptr: xb.ptr + uint64(4*off), n: n}
}

// Write copies src to x at off (synchronously).
func (b *Backend) Write(x backend.Buffer, off int, src []float32) {
	if len(src) == 0 {
		return
	}
	xb := x.(*Buffer)
	b.d.onContext(b.ctx, func() {
		b.setErr(b.d.check("cuMemcpyHtoD", b.d.cuMemcpyHtoD(xb.ptr+uint64(4*off), unsafe.Pointer(&src[0]), uintptr(4*len(src)))))
	})
	runtime.KeepAlive(xb)
}

// Read copies from x at off into dst, after all queued work.
func (b *Backend) Read(dst []float32, x backend.Buffer, off int) {
	if len(dst) == 0 {
		return
	}
	xb := x.(*Buffer)
	b.d.onContext(b.ctx, func() {
		b.setErr(b.d.check("cuMemcpyDtoH", b.d.cuMemcpyDtoH(unsafe.Pointer(&dst[0]), xb.ptr+uint64(4*off), uintptr(4*len(dst)))))
	})
	runtime.KeepAlive(xb)
}

func (b *Backend) upload(data []byte) (*allocation, error) {
	a, err := b.alloc(len(data))
	if err != nil {
		return nil, err
	}
	if len(data) > 0 {
		b.d.onContext(b.ctx, func() {
			err = b.d.check("cuMemcpyHtoD", b.d.cuMemcpyHtoD(a.ptr, unsafe.Pointer(&data[0]), uintptr(len(data))))
		})
	}
	return a, err
}

// Weight is a matrix on the device in its stored format.
type Weight struct {
	rows, cols int
	format     backend.Format
	data       *allocation // f32, bf16, or NVFP4 packed values
	scales     *allocation // NVFP4 block scales
	global     float32
	bias       *allocation
}

// Rows is the number of output features.
func (w *Weight) Rows() int { return w.rows }

// Cols is the number of input features.
func (w *Weight) Cols() int { return w.cols }

// Format is the storage format (F16 is widened to F32 at upload).
func (w *Weight) Format() backend.Format { return w.format }

func f32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

// Upload copies a weight to the device once, in its stored format.
func (b *Backend) Upload(h *backend.HostWeight) (backend.Weight, error) {
	if err := h.Validate(); err != nil {
		return nil, err
	}
	w := &Weight{rows: h.Rows, cols: h.Cols, format: h.Format}
	var err error
	switch h.Format {
	case backend.F32, backend.BF16:
		w.data, err = b.upload(h.Data)
	case backend.F16:
		v := make([]float32, h.Rows*h.Cols)
		quant.DecodeF16(v, h.Data)
		w.format = backend.F32
		w.data, err = b.upload(f32Bytes(v))
	case backend.NVFP4:
		w.global = h.Q.GlobalScale
		if w.data, err = b.upload(h.Q.Packed); err == nil {
			w.scales, err = b.upload(h.Q.Scales)
		}
	}
	if err == nil && h.Bias != nil {
		w.bias, err = b.upload(f32Bytes(h.Bias))
	}
	if err != nil {
		return nil, fmt.Errorf("kernels: uploading %s: %w", h.Name, err)
	}
	return w, nil
}

// ---------------------------------------------------------------------------
// Launching.

// launch queues kernel name with the given grid, block and dynamic shared
// memory; args are uint64 (device pointers), int, float32 or IdBlock values.
func (b *Backend) launch(name string, grid [3]int, block, shared int, args ...any) {
	f := b.function(name)
	slots := make([]uint64, 0, len(args))
	var blocks [][]int32
	for _, a := range args {
		switch v := a.(type) {
		case uint64:
			slots = append(slots, v)
		case int:
			slots = append(slots, uint64(uint32(int32(v))))
		case float32:
			slots = append(slots, uint64(math.Float32bits(v)))
		case float64:
			slots = append(slots, math.Float64bits(v))
		case []int32:
			blocks = append(blocks, v)
			slots = append(slots, 0)
		default:
			panic(fmt.Sprintf("kernels: launch %s: argument of type %T", name, a))
		}
	}
	params := make([]unsafe.Pointer, len(args))
	bi := 0
	for i, a := range args {
		if _, ok := a.([]int32); ok {
			params[i] = unsafe.Pointer(&blocks[bi][0])
			bi++
			continue
		}
		params[i] = unsafe.Pointer(&slots[i])
	}
	b.mu.Lock()
	profiling := b.profiling
	b.mu.Unlock()
	b.d.onContext(b.ctx, func() {
		var ev uintptr
		if profiling {
			ev = b.recordStart()
		}
		r := b.d.cuLaunchKernel(f, uint32(grid[0]), uint32(max(grid[1], 1)), uint32(max(grid[2], 1)),
			uint32(block), 1, 1, uint32(shared), b.stream, unsafe.Pointer(&params[0]), nil)
		b.setErr(b.d.check("launch "+name, r))
		if profiling {
			b.recordEnd(name, ev)
		}
	})
	runtime.KeepAlive(slots)
	runtime.KeepAlive(blocks)
}

func ptr(x backend.Buffer) uint64 { return x.(*Buffer).ptr }

func grid1(n, block int) [3]int { return [3]int{(n + block - 1) / block, 1, 1} }

// Embed gathers rows of table into dst.
func (b *Backend) Embed(dst backend.Buffer, table backend.Weight, ids []int32) {
	t := table.(*Weight)
	format, scales := 0, uint64(0)
	switch t.format {
	case backend.BF16:
		format = 1
	case backend.NVFP4:
		format, scales = 2, t.scales.ptr
	}
	const idBlock = 256
	for lo := 0; lo < len(ids); lo += idBlock {
		blk := make([]int32, idBlock)
		n := copy(blk, ids[lo:])
		out := ptr(dst) + uint64(4*lo*t.cols)
		b.launch("embed", [3]int{n, 1, 1}, 256, 0, t.data.ptr, scales, t.global, format, blk, out, t.cols)
	}
	runtime.KeepAlive(t)
}

// MatMul computes dst[m, rows] = x[m, cols]·wᵀ (+ bias).
func (b *Backend) MatMul(dst, x backend.Buffer, wt backend.Weight, m int) {
	w := wt.(*Weight)
	N, K := w.rows, w.cols
	bias := uint64(0)
	if w.bias != nil {
		bias = w.bias.ptr
	}
	const warps = 8
	g := grid1(N, warps)
	xp := ptr(x)
	aligned := xp%16 == 0 && ptr(dst)%4 == 0
	switch w.format {
	case backend.F32:
		name := "gemv_f32"
		if !aligned || K%4 != 0 {
			name = "gemv_f32_any"
		}
		b.launch(name, g, 32*warps, 0, w.data.ptr, xp, ptr(dst), bias, N, K, m)
	case backend.BF16:
		name := "gemv_bf16"
		if !aligned || K%8 != 0 {
			name = "gemv_bf16_any"
		}
		b.launch(name, g, 32*warps, 0, w.data.ptr, xp, ptr(dst), bias, N, K, m)
	case backend.NVFP4:
		if aligned && K%128 == 0 {
			// Tensor cores: a block of 8 warps per 16 output features, splitting K.
			b.launch("gemm_nvfp4_mma", grid1(N, 16), 32*8, 0, w.data.ptr, w.scales.ptr, w.global, xp, ptr(dst), bias, N, K, m)
			break
		}
		b.launch("gemv_nvfp4_any", g, 32*warps, 0, w.data.ptr, w.scales.ptr, w.global, xp, ptr(dst), bias, N, K, m)
	}
	runtime.KeepAlive(w)
}

// RMSNorm normalizes rows of weight.Len() values.
func (b *Backend) RMSNorm(dst, x, weight backend.Buffer, eps float32) {
	n := weight.Len()
	rows := x.Len() / n
	b.launch("rmsnorm", [3]int{rows, 1, 1}, min(1024, max(32, (n+31)/32*32)), 0, ptr(dst), ptr(x), ptr(weight), n, eps)
}

// RoPE rotates in place; the frequencies are uploaded per call (a few hundred bytes).
func (b *Backend) RoPE(x backend.Buffer, rows, heads, stride, off, pos0 int, r *layers.RoPE, inverse bool) {
	freqs := b.ropeTable(r)
	half := len(r.InvFreq)
	total := rows * heads * half
	inter, inv := 0, 0
	if r.Interleaved {
		inter = 1
	}
	if inverse {
		inv = 1
	}
	b.launch("rope", grid1(total, 256), 256, 0, ptr(x), freqs.ptr, rows, heads, stride, off, half, pos0, r.Scale, inter, inv)
	runtime.KeepAlive(freqs)
}

// ropeTable uploads the inverse frequencies once per *layers.RoPE.
func (b *Backend) ropeTable(r *layers.RoPE) *allocation {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ropes == nil {
		b.ropes = map[*layers.RoPE]*allocation{}
	}
	if a, ok := b.ropes[r]; ok {
		return a
	}
	b.mu.Unlock()
	a, err := b.upload(f32Bytes(r.InvFreq))
	b.mu.Lock()
	if err != nil {
		if b.err == nil {
			b.err = err
		}
		return &allocation{}
	}
	b.ropes[r] = a
	return a
}

// SwiGLU computes silu(gate)*up (clamped when limit > 0).
func (b *Backend) SwiGLU(dst, gate, up backend.Buffer, limit float32) {
	n := dst.Len()
	b.launch("swiglu", grid1(n, 256), 256, 0, ptr(dst), ptr(gate), ptr(up), n, limit)
}

// Add computes a + b.
func (b *Backend) Add(dst, x, y backend.Buffer) {
	n := dst.Len()
	b.launch("add", grid1(n, 256), 256, 0, ptr(dst), ptr(x), ptr(y), n)
}

// Scale computes a * s.
func (b *Backend) Scale(dst, x backend.Buffer, s float32) {
	n := dst.Len()
	b.launch("scale", grid1(n, 256), 256, 0, ptr(dst), ptr(x), s, n)
}

// Copy copies src into dst on the stream.
func (b *Backend) Copy(dst, src backend.Buffer) {
	b.copyBytes(ptr(dst), ptr(src), 4*dst.Len())
}

func (b *Backend) copyBytes(dst, src uint64, n int) {
	b.d.onContext(b.ctx, func() {
		b.setErr(b.d.check("cuMemcpyDtoDAsync", b.d.cuMemcpyDtoDAsync(dst, src, uintptr(n), b.stream)))
	})
}

// ---------------------------------------------------------------------------
// KV cache and attention.

type kvCache struct {
	shape backend.KVShape
	k, v  []*allocation
	n     []int
}

// NewKVCache allocates the cache on the device.
func (b *Backend) NewKVCache(s backend.KVShape) (backend.KVCache, error) {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Capacity <= 0 {
		return nil, fmt.Errorf("kernels: bad KV cache shape %+v", s)
	}
	if 4*s.Capacity > b.maxShare {
		return nil, fmt.Errorf("kernels: a context of %d positions exceeds this GPU's attention kernel limit of %d",
			s.Capacity, b.maxShare/4)
	}
	c := &kvCache{shape: s, n: make([]int, s.Layers)}
	bytes := 4 * s.Capacity * s.KVHeads * s.HeadDim
	for range s.Layers {
		k, err := b.alloc(bytes)
		if err != nil {
			return nil, err
		}
		v, err := b.alloc(bytes)
		if err != nil {
			return nil, err
		}
		c.k, c.v = append(c.k, k), append(c.v, v)
	}
	return c, nil
}

func (c *kvCache) Len() int { return c.n[len(c.n)-1] }
func (c *kvCache) Cap() int { return c.shape.Capacity }
func (c *kvCache) Bytes() int64 {
	return int64(2*c.shape.Layers*c.shape.Capacity*c.shape.KVHeads*c.shape.HeadDim) * 4
}
func (c *kvCache) Truncate(n int) {
	for l := range c.n {
		c.n[l] = min(c.n[l], max(n, 0))
	}
}

// Attention appends k, v to the cache at pos0 and attends causally.
func (b *Backend) Attention(out, q, k, v backend.Buffer, cache backend.KVCache, layer, pos0, m int, s layers.AttentionShape) {
	c := cache.(*kvCache)
	if pos0+m > c.shape.Capacity || pos0 > c.n[layer] {
		b.setErr(fmt.Errorf("kernels: attention at positions [%d, %d) past the cache (len %d, cap %d)", pos0, pos0+m, c.n[layer], c.shape.Capacity))
		return
	}
	row := 4 * s.KVHeads * s.HeadDim
	b.copyBytes(c.k[layer].ptr+uint64(pos0*row), ptr(k), m*row)
	b.copyBytes(c.v[layer].ptr+uint64(pos0*row), ptr(v), m*row)
	c.n[layer] = pos0 + m
	visible := pos0 + m
	if s.Window > 0 {
		visible = min(visible, s.Window)
	}
	b.launch("attention", [3]int{s.Heads, m, 1}, 128, 4*visible, ptr(out), ptr(q), c.k[layer].ptr, c.v[layer].ptr,
		pos0, s.Heads, s.KVHeads, s.HeadDim, s.Scale, s.Window)
	runtime.KeepAlive(c)
}
