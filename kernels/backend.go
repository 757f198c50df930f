package kernels

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/testimage"
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
	freeLater []uint64            // allocations collected while queued work may still use them (qmu)

	sampleMu sync.Mutex
	sample   sampler

	// The launch queue and CUDA graphs (queue.go); qmu guards them and the
	// stream, and is taken before mu.
	qmu           sync.Mutex
	q             queue
	dyn           *allocation // dynSlots ints: the queue's per-step values
	pushed        uint64      // launches queued so far (push), less those fused away: kvCache.lateRows's clock
	pushes        uint64      // operations pushed so far, never less (gemmXHeld's clock)
	gemmX         gemmXHeld   // what the NVFP4 GEMM's fp16 copy of x holds (gemm.go)
	graphs        GraphMode
	ahead         int // launch a queue's older ops once it holds this many (push; 0: never)
	graphCache    map[uint64]*graphEntry
	graphSeen     map[uint64]int
	graphLaunches int
	paramPtrs     []unsafe.Pointer
	candBuf       []int          // the fusion pass's candidate positions (pass.go)
	grouped       groupedScratch // GroupedMatMul's (dsv4.go)
	afterLong     bool           // the op last finalized (launched last) is a long m = 1 matmul (fuse.go: paceOf)
	tkmWS         *allocation    // the many-block top-k's workspace (dsv4.go: topK)
	moeBuf        *allocation    // MoE's picks, weights and activations (moe.go)
	moeBufLen     int
	tkmCap        int
	topk          topkScratch // CompressedIndexTopK's scores and top-k scratch, kept between calls (dsv4.go; guarded by partMu)
	tkc16Once     sync.Once
	tkc16OK       bool // tkc_select16's clusters of 16 fit on this GPU
	pdl           bool // programmatic dependent launch (queue.go)
	launchCfg     launchConfig
	launchAttrs   [2]launchAttribute
	partMu        sync.Mutex  // guards attnPart (taken before qmu)
	attnPart      *allocation // attention_kv's and attn_decode's split partials
	attnPartLen   int
	attnTicket    *allocation // attn_decode's counts of finished splits, one per row of blocks (zero between launches)
	attnTicketLen int
	gemm          gemmScratch // the NVFP4 GEMM's (gemm.go; guarded by partMu)
	fp8           fp8Scratch  // the FP8 GEMM's (fp8.go; guarded by partMu)
	g16           g16Scratch  // the bf16 GEMM's (bf16.go; guarded by partMu)
	g16v          g16vFns     // the joined bf16 matvecs' kernels (bf16.go; guarded by qmu)
	blas          blasState   // the cuBLAS handle and its scratch (cublas.go; scratch guarded by partMu)
	paged         pagedState  // where the step values hold the last paged call's rows (paged.go; guarded by qmu)

	// force: tests force a variant a default path can choose (for other
	// shapes, or on other GPUs), so that the conformance tests cover every
	// kernel a default path can launch. Only _test.go files (and the dev
	// build) set it; its zero value is the default path.
	force variants
	// exp: the dev build's experiments (dev.go, build tag manifold_dev);
	// nothing in the production build (dev_off.go), whose methods there
	// return what the default path does.
	exp experiments
}

// variants are the choices Backend.force makes instead of the default
// path's; each names a kernel or a launch shape that a default path takes
// for some shape or GPU. The zero value forces nothing.
type variants struct {
	gemvOff      bool   // NVFP4 matmuls on the GEMM (gemm.go) even at m = 1 (the default where the decode kernels do not take the shape)
	gemvPipe     bool   // m = 1: activations streamed with the weights (gemv_nvfp4_m1_d1; the default where x does not fit beside the ring)
	gemvOneTile  bool   // m = 1: one tile a block (gemv_nvfp4_s1_d1_lb) where several would be taken (gemv_nvfp4_s1_d1_mt)
	gemvTiles    int    // m = 1: tiles a block forced (> 1) where they fit
	noGemvTMA    bool   // m = 1: the staged kernels where gemv_nvfp4_tma8* would run (the default where two ring slots and x do not fit)
	tmaSlots     int    // gemv_nvfp4_tma8*: ring depth forced (> 0; a deep K leaves fewer slots)
	tmaTPB       int    // gemv_nvfp4_tma8*: tiles a block (> 0) instead of the persistent grid
	tmaRows      bool   // gemv_nvfp4_tma8 (row copies) where the tensor copies (gemv_nvfp4_tma8_tm) would run
	tmaMapsAll   bool   // gemv_nvfp4_tma8_tm in launches of every size (the default from tmaMapsMin weights)
	bf16Kernel   string // the aligned bf16 matmul kernel below g16MinM tokens ("" picks by shape; gemv_bf16_pf is only forced yet)
	g16All       bool   // bf16 matmuls of every m > 1 on the GEMM (bf16.go), not gemv_bf16_u4 below g16MinM
	g16Tile      int    // the bf16 GEMM's token tile (16, 32, 64, 128) instead of the smallest holding m
	g16Splits    int    // the bf16 GEMM's K split this many ways (> 0) instead of filling the multiprocessors
	gemmK128     bool   // the NVFP4 GEMM in stages of 128 elements even where 256 fit
	gemmK256     bool   // ... of 256 elements even where 512 would be taken
	gemmTile     string // the NVFP4 GEMM variant of this name (gemmKernels) wherever the GEMM runs ("": gemmPick's)
	gemmXEvery   bool   // every NVFP4 GEMM converts its x, even where the GEMM before it left it converted (matmul benchmarks)
	topkPath     int    // a top-k path (topkMany, topkOneBlock)
	attnMMAOff   bool   // dsa_attend_split and v4_attention4 where the mma kernels would run
	attnMMA8     bool   // the mma kernels' 8-warp blocks where 16 would run
	tkc8         bool   // the cluster top-k in clusters of 8 where 16 would run
	idxMMAOff    bool   // idx_scores_tile where idx_scores_mma would run
	attnKV       bool   // one-row attention on attention_kv instead of attn_short / attn_decode
	attnGlobal   bool   // attn_decode's splits merged through global memory, not in a cluster (the default past 8 splits)
	attnNoShort  bool   // one-row attention on attn_decode where attn_short would run (the default at long contexts)
	attnNoCast   bool   // attn_short's blocks each copy the rows, not multicast (the default with one head group or two shares)
	mhcTailOff   bool   // MHCCoeffsPre in four launches at every token count
	fp8          int    // FP8 weights: fp8ForceGEMV or fp8ForceGEMM at every m, fp8ForceTMA (gemv_fp8_tma at m = 1), or fp8Widen (uploaded as bf16/f32, as before the FP8 kernels)
	pagedKeys    int    // paged attention split into shares of this many keys (> 0), merged by the last to finish (the default where rows leave the GPU short of blocks)
	pagedUnfused bool   // paged decode attention after its own paged_append where the append would move into it (the default when some row is not a decode row)
	pagedNoTiles bool   // paged attention of prompt chunks on paged_attn a row a block where paged_prefill would tile them (the default for other head sizes and short chunks)
	blasOff      bool   // bf16 and NVFP4 matmuls on the own kernels where cuBLAS would take them (cublas.go; the default where libcublas does not load)
	blasAll      bool   // bf16 and NVFP4 matmuls of every m >= 2 on cuBLAS where it loaded (the default from Options.CuBLASMinM, CuBLASNVFP4MinM)
	blasChunk    int    // the cuBLAS NVFP4 path's dequantized chunks of this many weight rows (> 0; the default where a weight passes blasChunkBytes)
	blasStacked  int    // the cuBLAS bf16 path's x halves as one GEMM over 2m rows (1) or two GEMMs (2) (0: by m, blasStackedMaxM)
}

// The values of variants.fp8 (fp8.go).
const (
	fp8ForceGEMV = 1 + iota
	fp8ForceGEMM
	fp8Widen
	fp8ForceTMA // gemv_fp8_tma at m = 1 (where its ring fits), the default rules otherwise
)

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

// New opens GPU ordinal and loads the kernels, with o's settings (the zero
// Options for the defaults).
func New(ordinal int, o Options) (*Backend, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	return newOn(d, ordinal, o)
}

// newOn is New on the driver entry points d (libcuda's; tests pass a
// recording stand-in, fakedriver_test.go, to count what a step queues
// where there is no GPU).
func newOn(d *driver, ordinal int, o Options) (*Backend, error) {
	var err error
	img := image
	if testimage.Image != nil { // tests: an image built after the binary (kernels/gpu.sh run)
		img = testimage.Image
	}
	if img, err = devImage(img); err != nil {
		return nil, err
	}
	if len(img) == 0 {
		return nil, fmt.Errorf("kernels: this build embeds no kernel image (run kernels/build.sh on a machine with nvcc): %w", ErrNoDriver)
	}
	o = devOptions(o)
	b := &Backend{d: d, fn: map[string]uintptr{}, live: map[uint64]struct{}{},
		graphs: o.Graphs, graphCache: map[uint64]*graphEntry{}, graphSeen: map[uint64]int{},
		pdl: !o.NoPDL, ahead: o.ahead(), exp: newExperiments()}
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
		for _, name := range []string{"gemv_f32", "gemv_bf16", "gemv_f32_any", "gemv_bf16_any",
			"gemv_nvfp4_any", "rmsnorm", "attention", "swiglu", "add", "scale",
			"sample_partial", "sample_final", "embed_ids", "rope_dyn", "rope_norm_dyn", "attention_kv", "attention_kv_64", "attention_kv_128", "attn_combine", "attn_decode_64", "attn_decode_128", "attn_short_64", "attn_short_128", "gemv_bf16_u4",
			"gemv_nvfp4_m1_d1", "gemv_nvfp4_s1_d1_lb", "gemv_nvfp4_s1_d1_mt", "gemv_nvfp4_tma8", "gemv_nvfp4_tma8_tm"} {
			var f uintptr
			if err = d.check("cuModuleGetFunction "+name, d.cuModuleGetFunction(&f, b.module, cString(name))); err != nil {
				return
			}
			b.fn[name] = f
		}
		// Dynamic shared memory past the default 48 KB must be asked for.
		for name, bytes := range map[string]int{"attention": b.maxShare, "sample_final": sampleFinalShared,
			"attention_kv": b.maxShare - attnStatic, "attention_kv_64": b.maxShare - attnStatic,
			"attention_kv_128": b.maxShare - attnStatic, "attn_decode_64": b.maxShare, "attn_decode_128": b.maxShare, "attn_short_64": b.maxShare, "attn_short_128": b.maxShare, "gemv_nvfp4_m1_d1": b.maxShare,
			"gemv_nvfp4_s1_d1_lb": b.maxShare, "gemv_nvfp4_s1_d1_mt": b.maxShare, "gemv_nvfp4_tma8": b.maxShare, "gemv_nvfp4_tma8_tm": b.maxShare} {
			if err = d.check("cuFuncSetAttribute "+name, d.cuFuncSetAttribute(b.fn[name], 8, int32(bytes))); err != nil {
				return
			}
		}
		// The dev build's kernels (in the dev image only) and switches (dev.go).
		b.exp.setup(b)
	})
	if err != nil {
		b.Close()
		return nil, err
	}
	if b.dyn, err = b.alloc(4 * dynSlots); err != nil {
		b.Close()
		return nil, err
	}
	b.initBLAS(o) // cublas.go: the prefill GEMMs on cuBLAS where it loads
	return b, nil
}

// Name is "cuda: <GPU name>; GEMM: <engine>", the engine of the prefill
// matmuls (GEMMEngine: cuBLAS, its version and thresholds, or the own
// kernels and why).
func (b *Backend) Name() string {
	if b.blas.note == "" {
		return "cuda: " + b.name
	}
	return "cuda: " + b.name + "; GEMM: " + b.blas.note
}

// FreeMemoryBytes is the GPU memory free now (cuMemGetInfo; 0 if the
// driver does not say), which the engine checks a session's caches against
// before allocating them. Buffers dropped but not yet collected still count
// as used.
func (b *Backend) FreeMemoryBytes() int64 {
	var free, total uintptr
	var r int32 = -1
	b.d.onContext(b.ctx, func() { r = b.d.cuMemGetInfo(&free, &total) })
	if r != 0 {
		return 0
	}
	return int64(free)
}

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

// Flush launches the queued work without waiting for it, so that the GPU
// runs it while the host goes on (model/offload.go computes the
// host-resident experts of a layer meanwhile).
func (b *Backend) Flush() { b.onContext(func() {}) }

// Sync waits for queued work and returns the first error seen since the last Sync.
func (b *Backend) Sync() error {
	b.onContext(func() { b.setErr(b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream))) })
	return b.takeErr()
}

// takeErr returns and clears the first error seen since the last Sync.
func (b *Backend) takeErr() error {
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
	b.onContext(func() {
		b.destroyGraphs()
		if b.stream != 0 {
			errs = append(errs, b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream)))
			b.closeBLAS() // before its stream goes
			b.d.cuStreamDestroy(b.stream)
			b.stream = 0
		}
		for i, ev := range b.sample.events {
			if ev != 0 {
				b.d.cuEventDestroy(ev)
				b.sample.events[i] = 0
			}
		}
		if b.sample.host != nil {
			b.d.cuMemFreeHost(b.sample.host)
			b.sample.host = nil
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
	// Under qmu (no capture is under way) but without launching the queue:
	// nothing queued can refer to new memory.
	b.qmu.Lock()
	defer b.qmu.Unlock()
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

// free returns device memory once nothing refers to it. Queued work that
// has not been launched yet may still name the address (launch arguments are
// addresses, and a caller may drop a buffer right after queueing an op on
// it), so while the queue holds work the free waits for its launch
// (flushLocked). Close frees what is still live; after it, an address may
// belong to another allocation, so nothing more is freed here.
func (b *Backend) free(ptr uint64) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if len(b.q.ops) > 0 {
		b.freeLater = append(b.freeLater, ptr)
		return
	}
	delete(b.live, ptr)
	b.d.onContext(b.ctx, func() { b.d.cuMemFree(ptr) })
}

// freeQueued frees what free deferred, once the queue's work is launched (the
// driver's free waits for launched work that uses the memory). It runs with
// qmu held and the context current.
func (b *Backend) freeQueued() {
	if len(b.freeLater) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		for _, p := range b.freeLater {
			delete(b.live, p)
			b.d.cuMemFree(p)
		}
	}
	b.freeLater = b.freeLater[:0]
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
	b.onContext(func() {
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
	b.onContext(func() {
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
		b.onContext(func() {
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
	maps       *tensorMaps // gemv_nvfp4_tma8_tm's descriptors, encoded on first use (fuse.go: tensorMapsOf)
	mapsTried  bool
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
	h, err := widen(h, b.force.fp8 != fp8Widen) // the block-scaled formats, in one the kernels run (widen.go)
	if err != nil {
		return nil, err
	}
	w := &Weight{rows: h.Rows, cols: h.Cols, format: h.Format}
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
	case backend.FP8Block:
		err = b.uploadFP8(w, h) // fp8.go
	default:
		err = fmt.Errorf("%s: %w", h.Format, backend.ErrUnsupportedFormat)
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
// memory; args are uint64 (device pointers), int, float32, float64 or []int32
// (IdBlock) values. Queued work runs when the queue is launched (queue.go):
// code that then talks to the driver directly goes through b.onContext.
func (b *Backend) launch(name string, grid [3]int, block, shared int, args ...any) {
	b.enqueue(name, grid, block, shared, args...)
}

func ptr(x backend.Buffer) uint64 { return x.(*Buffer).ptr }

func grid1(n, block int) [3]int { return [3]int{(n + block - 1) / block, 1, 1} }

// Embed gathers rows of table into dst; the ids travel in the queue's step
// values, so a decode step's launches do not depend on the token.
func (b *Backend) Embed(dst backend.Buffer, table backend.Weight, ids []int32) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	for lo := 0; lo < len(ids); {
		n := min(len(ids)-lo, dynSlots/2) // fits in an empty queue's step values
		at, _ := b.stepIDs(ids[lo : lo+n])
		b.q.keep = append(b.q.keep, dst)
		b.queueEmbed(ptr(dst)+uint64(4*lo*table.Cols()), table.(*Weight), at, n)
		lo += n
	}
}

// EmbedToken is Embed of the token id that src holds on the device (see
// backend.TokenPipeliner).
func (b *Backend) EmbedToken(dst backend.Buffer, table backend.Weight, src backend.Buffer) {
	if src.Len() != 1 {
		b.setErr(fmt.Errorf("kernels: EmbedToken reads a buffer of 1 token id, not %d", src.Len()))
		return
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.q.keep = append(b.q.keep, src, dst)
	b.queueEmbed(ptr(dst), table.(*Weight), ptr(src), 1)
}

// queueEmbed queues the gather of the n rows of t whose ids are at the
// device address ids. qmu must be held.
func (b *Backend) queueEmbed(dst uint64, t *Weight, ids uint64, n int) {
	format, scales := 0, uint64(0)
	switch t.format {
	case backend.BF16:
		format = 1
	case backend.NVFP4:
		format, scales = 2, t.scales.ptr
	case backend.FP8Block:
		b.setErr(fmt.Errorf("kernels: an embedding table in FP8 (%d x %d): %w", t.rows, t.cols, backend.ErrUnsupportedFormat))
		return
	}
	b.q.keep = append(b.q.keep, t)
	o := op{kind: opKernel, name: "embed_ids", fn: b.fn["embed_ids"], grid: [3]uint32{uint32(n), 1, 1}, block: 256, pdl: pdlKernel("embed_ids")}
	o.setParams(t.data.ptr, scales, t.global, format, ids, dst, t.cols)
	b.push(o)
}

// stepIDs puts ids in the queue's step values and returns their device
// address, launching the queue first when they do not fit; ok is false when
// they do not fit an empty queue's either. qmu must be held.
func (b *Backend) stepIDs(ids []int32) (at uint64, ok bool) {
	off := b.q.addIDs(ids)
	if off < 0 {
		b.d.onContext(b.ctx, b.flushLocked)
		if off = b.q.addIDs(ids); off < 0 {
			return 0, false
		}
	}
	return b.dyn.ptr + uint64(4*off), true
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
		if xb := x.(*Buffer); b.blasBF16(xb, w, m) {
			// Prefill sizes: cuBLAS, x as two bf16 halves (cublas.go).
			b.gemmBLAS16(dst.(*Buffer), xb, w, m, false)
			break
		}
		if xb := x.(*Buffer); m > 1 && g16Eligible(xb, w, m, b.force.g16All) {
			// Tensor cores, each weight read once per token tile (bf16.go).
			b.gemm16(dst.(*Buffer), xb, w, m, false)
			break
		}
		if xb, db := x.(*Buffer), dst.(*Buffer); b.gemv16Eligible(db, xb, w, m) {
			// Joinable: q, k, v in one launch, SwiGLU and residual adds as
			// epilogues (bf16.go).
			b.queueGemv16(db, xb, w, m)
			break
		}
		// Four loads in flight per lane pay off on tall matrices (the LM head:
		// 100% of the copy rate against 90%) and for m > 1; at m = 1 on the
		// 4096/14336 shapes one load measured faster (docs/PERFORMANCE.md).
		name := "gemv_bf16"
		if N >= 32768 || m > 1 {
			name = "gemv_bf16_u4"
		}
		if b.force.bf16Kernel != "" {
			name = b.force.bf16Kernel
		}
		if !aligned || K%8 != 0 {
			name = "gemv_bf16_any"
		} else if N <= warps*b.sms && m <= 4 && b.force.bf16Kernel == "" {
			// Few rows (the MoE routers; up to 1056 on an H100, where a warp
			// per row would leave multiprocessors without a block): a block
			// per row.
			name, g = "gemv_bf16_sk", [3]int{N, 1, 1}
		}
		b.launch(name, g, 32*warps, 0, w.data.ptr, xp, ptr(dst), bias, N, K, m)
	case backend.NVFP4:
		if xb := x.(*Buffer); b.blasNVFP4(xb, w, m) {
			// Prefill sizes: the weight dequantized to fp16 (exactly) and
			// cuBLAS (cublas.go).
			b.gemmBLASNVFP4(dst.(*Buffer), xb, w, m)
			break
		}
		if xb, db := x.(*Buffer), dst.(*Buffer); !b.force.gemvOff && gemvEligible(xb, db, w, m, b.exp.gemvSmallM()) {
			// Decode shapes: pipelined tensor-core kernel, fusable (fuse.go).
			b.qmu.Lock()
			b.queueGemv(db, xb, w, m)
			b.qmu.Unlock()
			break
		}
		if aligned && K%128 == 0 {
			// Tensor cores, each weight decoded once per token tile (gemm.go).
			b.gemmNVFP4(dst.(*Buffer), x.(*Buffer), w, m)
			break
		}
		b.launch("gemv_nvfp4_any", g, 32*warps, 0, w.data.ptr, w.scales.ptr, w.global, xp, ptr(dst), bias, N, K, m)
	case backend.FP8Block:
		b.matmulFP8(dst.(*Buffer), x.(*Buffer), w, m) // fp8.go
	}
	runtime.KeepAlive(w)
}

// RMSNorm normalizes rows of weight.Len() values. A single row followed by
// an NVFP4 matmul of it is computed inside that matmul (fuse.go).
func (b *Backend) RMSNorm(dst, x, weight backend.Buffer, eps float32) {
	b.qmu.Lock()
	b.queueNorm(dst.(*Buffer), x.(*Buffer), weight.(*Buffer), eps)
	b.qmu.Unlock()
}

// RoPE rotates in place; the position comes from the queue's step values,
// and a RoPE of k right after one of q joins it (fuse.go).
func (b *Backend) RoPE(x backend.Buffer, rows, heads, stride, off, pos0 int, r *layers.RoPE, inverse bool) {
	freqs := b.ropeTable(r)
	b.qmu.Lock()
	b.queueRoPE(x.(*Buffer), rows, heads, stride, off, pos0, r, freqs.ptr, inverse)
	b.q.keep = append(b.q.keep, freqs)
	b.qmu.Unlock()
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
	b.qmu.Lock()
	fused := b.fuseSwiGLU(dst.(*Buffer), gate.(*Buffer), up.(*Buffer), limit)
	b.qmu.Unlock()
	if fused {
		return
	}
	n := dst.Len()
	fx := fxOf([]*Buffer{dst.(*Buffer)}, gate.(*Buffer), up.(*Buffer))
	b.enqueueFx(fx, "swiglu", grid1(n, 256), 256, 0, ptr(dst), ptr(gate), ptr(up), n, limit)
}

// Add computes a + b.
func (b *Backend) Add(dst, x, y backend.Buffer) {
	b.qmu.Lock()
	fused := b.fuseAdd(dst.(*Buffer), x.(*Buffer), y.(*Buffer))
	b.qmu.Unlock()
	if fused {
		return
	}
	n := dst.Len()
	fx := fxOf([]*Buffer{dst.(*Buffer)}, x.(*Buffer), y.(*Buffer))
	b.enqueueFx(fx, "add", grid1(n, 256), 256, 0, ptr(dst), ptr(x), ptr(y), n)
}

// Scale computes a * s.
func (b *Backend) Scale(dst, x backend.Buffer, s float32) {
	n := dst.Len()
	b.enqueueFx(fxOf([]*Buffer{dst.(*Buffer)}, x.(*Buffer)), "scale", grid1(n, 256), 256, 0, ptr(dst), ptr(x), s, n)
}

// Copy copies src into dst on the stream.
func (b *Backend) Copy(dst, src backend.Buffer) {
	b.copyBytes(ptr(dst), ptr(src), 4*dst.Len())
}

// copyBytes queues copy_words over n bytes (a multiple of 4): a kernel, so
// that the kernel after it may start early, which the driver's copy would
// not allow.
func (b *Backend) copyBytes(dst, src uint64, n int) {
	words := n / 4
	if words == 0 {
		return
	}
	var fx effects
	fx.read(span{src, src + uint64(n)})
	fx.write(span{dst, dst + uint64(n)})
	b.enqueueFx(fx, "copy_words", [3]int{min((words+4*256-1)/(4*256), 4*b.sms), 1, 1}, 256, 0, dst, src, uint64(words))
}

// copyDriver queues the driver's device-to-device copy of n bytes.
func (b *Backend) copyDriver(dst, src uint64, n int) {
	b.qmu.Lock()
	b.push(op{kind: opCopy, name: "copy", params: []uint64{dst, src, uint64(n)}})
	b.qmu.Unlock()
}

// ---------------------------------------------------------------------------
// KV cache and attention.

type kvCache struct {
	shape  backend.KVShape
	k, v   []*allocation
	n      []int
	writes [][]kvWrite // a layer's row writes among the last residentGrids launches queued (lateRows)
}

// kvWrite: rows from lo on of a layer's cache are written by the launch
// numbered seq (Backend.pushed after it was queued).
type kvWrite struct {
	lo  int
	seq uint64
}

// residentGrids is how many grids a device holds at once at most (CUDA's
// "maximum number of resident grids per device", 128 on compute capability
// 9.0). Every kernel launched after its predecessor's trigger waits for that
// predecessor before it completes (TestKernelsWaitForPredecessor), so a
// launch's blocks start while an earlier one is unfinished only if every
// launch between them is resident too: the launch residentGrids back or
// older has completed.
const residentGrids = 128

// noteWrite records that the launch queued last (seq) writes rows from lo on
// of layer, forgetting writes that no launch queued from now on can overlap.
func (c *kvCache) noteWrite(layer, lo int, seq uint64) {
	w := c.writes[layer][:0]
	for _, x := range c.writes[layer] {
		if seq-x.seq < residentGrids {
			w = append(w, x)
		}
	}
	c.writes[layer] = append(w, kvWrite{lo, seq})
}

// lateRows is how many of the rows before p the one-row attention about to
// be queued (after launch now) must read after its wait rather than before:
// from the lowest row that one of the last residentGrids launches writes,
// whose writer may not have finished when the attention's blocks start.
// Decode steps of more than residentGrids launches leave none; shorter ones
// the same count every step. From row 0 on it is lateAll, the same at every
// position, so that consecutive steps queue the same launches (graphs).
func (c *kvCache) lateRows(layer, p int, now uint64) int {
	r0 := p
	for _, w := range c.writes[layer] {
		if now-w.seq < residentGrids && w.lo < r0 {
			r0 = w.lo
		}
	}
	if r0 <= 0 && p > 0 {
		return lateAll
	}
	return p - r0
}

// lateAll is lateRows's "every row" (more than any cache holds).
const lateAll = 1 << 30

// NewKVCache allocates the cache on the device.
func (b *Backend) NewKVCache(s backend.KVShape) (backend.KVCache, error) {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Capacity <= 0 {
		return nil, fmt.Errorf("kernels: bad KV cache shape %+v", s)
	}
	if 4*s.Capacity > b.maxShare {
		return nil, fmt.Errorf("kernels: a context of %d positions exceeds this GPU's attention kernel limit of %d",
			s.Capacity, b.maxShare/4)
	}
	c := &kvCache{shape: s, n: make([]int, s.Layers), writes: make([][]kvWrite, s.Layers)}
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

// attnStatic is attention_kv's static shared memory (q, the warps' partial
// outputs, a reduction array), less than which its dynamic share may take.
const attnStatic = 4*256 + 4*8*256 + 4*32

// Attention appends k, v to the cache at pos0 and attends causally. Head
// sizes that are multiples of 4 up to 256 take attention_kv, which appends
// in the same launch and reads the position from the queue's step values;
// decode over long contexts splits the keys over blocks (flash-decoding).
func (b *Backend) Attention(out, q, k, v backend.Buffer, cache backend.KVCache, layer, pos0, m int, s layers.AttentionShape) {
	c := cache.(*kvCache)
	if pos0+m > c.shape.Capacity || pos0 > c.n[layer] {
		b.setErr(fmt.Errorf("kernels: attention at positions [%d, %d) past the cache (len %d, cap %d)", pos0, pos0+m, c.n[layer], c.shape.Capacity))
		return
	}
	c.n[layer] = pos0 + m
	defer func() { // whichever launches below write the rows
		b.qmu.Lock()
		c.noteWrite(layer, pos0, b.pushed)
		b.qmu.Unlock()
	}()
	visible := pos0 + m
	if s.Window > 0 {
		visible = min(visible, s.Window)
	}
	if s.HeadDim%4 != 0 || s.HeadDim > 256 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 {
		row := 4 * s.KVHeads * s.HeadDim
		b.copyBytes(c.k[layer].ptr+uint64(pos0*row), ptr(k), m*row)
		b.copyBytes(c.v[layer].ptr+uint64(pos0*row), ptr(v), m*row)
		b.launch("attention", [3]int{s.Heads, m, 1}, 128, 4*visible, ptr(out), ptr(q), c.k[layer].ptr, c.v[layer].ptr,
			pos0, s.Heads, s.KVHeads, s.HeadDim, s.Scale, s.Window)
		runtime.KeepAlive(c)
		return
	}
	// Launch shape from the visible length rounded up to a power of two, so
	// that consecutive decode steps queue the same launches.
	vb := 1
	for vb < visible {
		vb *= 2
	}
	vb = min(vb, c.shape.Capacity)
	if m == 1 && !b.force.attnKV && (s.HeadDim == 64 || s.HeadDim == 128) && s.Heads/s.KVHeads <= 16 {
		if !b.force.attnNoShort && b.attnShortDecode(out, q, k, v, c, layer, pos0, visible, s) {
			return
		}
		b.attnDecode(out, q, k, v, c, layer, pos0, vb, s)
		return
	}
	if m >= attnPrefillRows && (s.HeadDim == 64 || s.HeadDim == 128) {
		b.attnPrefill(out, q, k, v, c, layer, pos0, m, s)
		return
	}
	splits := 1
	if m <= 4 {
		splits = min(max(vb/256, 1), 64)
	}
	for 4*((vb+splits-1)/splits) > b.maxShare-attnStatic {
		splits *= 2
	}
	share := (vb + splits - 1) / splits
	var part uint64
	var partAlloc *allocation
	if splits > 1 {
		need := m * s.Heads * splits * (s.HeadDim + 2)
		var err error
		if partAlloc, _, err = b.attnScratch(need, 0); err != nil {
			b.setErr(err)
			return
		}
		part = partAlloc.ptr
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.q.keep = append(b.q.keep, c, out, q, k, v, partAlloc)
	name := "attention_kv"
	if s.HeadDim == 64 || s.HeadDim == 128 {
		name = fmt.Sprintf("attention_kv_%d", s.HeadDim)
	}
	o := op{kind: opKernel, name: name, fn: b.fn[name], grid: [3]uint32{uint32(s.Heads), uint32(m), uint32(splits)},
		block: 256, shared: uint32(4 * share), pdl: pdlKernel(name)}
	o.setParams(ptr(out), ptr(q), ptr(k), ptr(v), c.k[layer].ptr, c.v[layer].ptr, b.dyn.ptr, b.q.posRel(pos0),
		s.Heads, s.KVHeads, s.HeadDim, s.Scale, s.Window, part)
	b.push(o)
	if splits > 1 {
		o := op{kind: opKernel, name: "attn_combine", fn: b.fn["attn_combine"], grid: [3]uint32{uint32(s.Heads), uint32(m), 1}, block: 128, pdl: pdlKernel("attn_combine")}
		o.setParams(ptr(out), part, s.Heads, s.HeadDim, splits)
		b.push(o)
	}
}

// attnPrefillRows is where rows of new tokens (a prompt chunk) take
// attn_prefill, which loads each tile of keys once for 64 rows, instead of
// attention_kv, which loads every key once per row.
const attnPrefillRows = 32

// attnPrefill queues attn_prefill_{64,128} (decode.cuh): a block per query
// head and 64 rows.
func (b *Backend) attnPrefill(out, q, k, v backend.Buffer, c *kvCache, layer, pos0, m int, s layers.AttentionShape) {
	name := fmt.Sprintf("attn_prefill_%d", s.HeadDim)
	fn := b.function(name)
	if fn == 0 {
		return // the lookup's error is kept for Sync
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.q.keep = append(b.q.keep, c, out, q, k, v)
	floats := 3*64*(s.HeadDim+4) + 64*68
	o := op{kind: opKernel, name: name, fn: fn, grid: [3]uint32{uint32(s.Heads), uint32((m + 63) / 64), 1},
		block: 256, shared: uint32(4 * floats), pdl: pdlKernel(name)}
	o.setParams(ptr(out), ptr(q), ptr(k), ptr(v), c.k[layer].ptr, c.v[layer].ptr, b.dyn.ptr, b.q.posRel(pos0),
		m, s.Heads, s.KVHeads, s.Scale, s.Window)
	b.push(o)
}

// attnDecodeChunk is attn_decode's chunk of keys (ATTD_CH in decode.cuh).
const attnDecodeChunk = 32

// maxAttnCluster is the most splits attn_decode merges in one thread block
// cluster (the portable cluster size).
const maxAttnCluster = 8

// attnDecode queues attn_decode for one query row: the keys split over
// blocks (each at least a chunk, about two blocks per multiprocessor at long
// contexts, the query heads of a kv head spread over more blocks at short
// ones), merged by the last block of each row of splits.
// A RoPE of exactly q and k queued just before it moves into the launch,
// and so do in-place per-head RMSNorms of q and k queued before that (attnRow).
func (b *Backend) attnDecode(out, q, k, v backend.Buffer, c *kvCache, layer, pos0, vb int, s layers.AttentionShape) {
	splits := min(max(vb/attnDecodeChunk, 1), max((2*b.sms+s.KVHeads-1)/s.KVHeads, 1))
	// Up to 8 splits (a portable cluster) merge in distributed shared memory.
	cluster := !b.force.attnGlobal && splits > 1 && splits <= maxAttnCluster
	G := s.Heads / s.KVHeads
	hgroups := b.attnHeadGroups(G, s.KVHeads, splits)
	rowsOfBlocks := s.KVHeads * hgroups
	var part uint64
	var keep []any
	var ticket uint64
	if splits > 1 && !cluster {
		pa, ta, err := b.attnScratch(s.Heads*splits*(s.HeadDim+2), rowsOfBlocks)
		if err != nil {
			b.setErr(err)
			return
		}
		part, ticket = pa.ptr, ta.ptr
		keep = append(keep, pa, ta)
	}
	b.qmu.Lock()
	defer b.qmu.Unlock()
	a := b.attnRow(out, q, k, v, c, pos0, rowsOfBlocks*splits, s)
	b.q.keep = append(b.q.keep, keep...)
	name := fmt.Sprintf("attn_decode_%d", s.HeadDim)
	floats := 4*attnDecodeChunk*(s.HeadDim+4) + G*s.HeadDim + G*attnDecodeChunk + 3*s.HeadDim
	o := op{kind: opKernel, name: name, fn: b.fn[name], grid: [3]uint32{uint32(rowsOfBlocks), uint32(splits), 1},
		block: 128, pdl: pdlKernel(name)}
	if cluster {
		floats += splits * (G / hgroups) * (s.HeadDim + 4) // block 0's merge area (ATTD_PM in decode.cuh)
		o.cluster = uint32(splits)
	}
	o.shared = uint32(4 * floats)
	o.setParams(ptr(out), ptr(q), ptr(k), ptr(v), c.k[layer].ptr, c.v[layer].ptr, b.dyn.ptr, a.posRel,
		s.Heads, s.KVHeads, s.Scale, s.Window, part, ticket, a.freqs, a.rhalf, a.roff, a.rscale, a.rinter, a.qnw, a.knw,
		a.neps, hgroups, boolInt(cluster)|b.exp.attnAblate(), c.lateRows(layer, pos0, b.pushed), a.trace)
	if !b.exp.attnSkip() {
		b.push(o)
	}
}

// attnHeadGroups is how many groups the G query heads of each of kvHeads
// kv heads go to, at splits blocks a group, in a one-row attention launch:
// short contexts leave most multiprocessors idle, so the heads go to
// several blocks (each loading the keys again, from L2) while that keeps
// the grid within about the multiprocessor count.
func (b *Backend) attnHeadGroups(G, kvHeads, splits int) int {
	hg := 1
	for G%(2*hg) == 0 && 2*hg*kvHeads*splits <= b.sms {
		hg *= 2
	}
	return hg
}

// attnRowArgs are what attn_decode and attn_short take from the queue: the
// position relative to its step values, a RoPE moved into the launch
// (rhalf 0: none) and where the trace goes (0: none).
type attnRowArgs struct {
	posRel              int
	freqs               uint64
	rhalf, roff, rinter int
	rscale              float32
	qnw, knw            uint64  // the weights of q's and k's per-head RMSNorms moved into the launch (0: none)
	neps                float32 // their epsilon
	trace               uint64
}

// attnRow prepares a one-row attention launch of blocks blocks at pos0 (with
// b.qmu held): when the last queued op rotates exactly q and k at this
// position, it is dropped and its angles go into the launch; when the ops
// then last are in-place RMSNorms of q's heads and of k's (Qwen3's q_norm
// and k_norm, rmsnorm launches of their own otherwise: 9% of the
// Qwen3-8B-shape decode step's device time), they are dropped too and their
// weights go into the launch, which normalizes each head as it reads it.
// As with the RoPE, q and k are left in memory as the matmul wrote them
// (nothing after the attention reads them); the buffers
// stay alive through the queue; the dev build's trace is on when one is
// running and has room for the grid.
func (b *Backend) attnRow(out, q, k, v backend.Buffer, c *kvCache, pos0, blocks int, s layers.AttentionShape) attnRowArgs {
	q0 := &b.q
	a := attnRowArgs{posRel: q0.posRel(pos0), rscale: 1}
	if n := len(q0.ops); n > 0 && q0.ops[n-1].rope != nil {
		r := q0.ops[n-1].rope
		if r.x1 == spanOf(q) && r.x2 == spanOf(k) && r.heads1 == s.Heads && r.heads2 == s.KVHeads && r.rows == 1 &&
			r.stride == s.HeadDim && r.inverse == 0 && r.posRel == a.posRel && r.off+2*r.half <= s.HeadDim {
			a.freqs, a.rhalf, a.roff, a.rscale, a.rinter = r.freqs, r.half, r.off, r.scale, r.inter
			a.qnw, a.knw, a.neps = r.w1, r.w2, r.eps // the norms it took in (takeHeadNorm)
			q0.ops = q0.ops[:n-1]
			b.pushed-- // never launched
		}
	}
	// In-place per-head RMSNorms of q and k (the kv head's row) queued
	// just before (before the RoPE, when one moved in): the launch
	// normalizes the heads as it reads them. Both take one epsilon.
	qs, ks := spanOf(q), spanOf(k)
	for n := len(q0.ops); n > 0 && q0.ops[n-1].hnorm != nil; n-- {
		h := q0.ops[n-1].hnorm
		if h.n != s.HeadDim || (a.qnw != 0 || a.knw != 0) && h.eps != a.neps {
			break
		}
		if a.qnw == 0 && h.x == qs && h.rows == s.Heads {
			a.qnw = h.w
		} else if a.knw == 0 && h.x == ks && h.rows == s.KVHeads {
			a.knw = h.w
		} else {
			break
		}
		a.neps = h.eps
		q0.ops = q0.ops[:n-1]
		b.pushed-- // never launched
	}
	q0.keep = append(q0.keep, c, out, q, k, v)
	a.trace = b.exp.attnTrace(q0, blocks) // the dev build's timeline; 0 in production
	return a
}

// attnShortWarps is attn_short's warps a block (ATTS_WARPS in decode.cuh),
// attnShortSlice the most keys one of them weighs (a key a lane).
const (
	attnShortWarps = 16
	attnShortSlice = 32
)

// attnShortShares is the most shares attn_short splits a context into
// (longer contexts take attn_decode, whose blocks hold a chunk each).
const attnShortShares = 2

// attnShortRound is the granularity of attn_short's launch shape: the
// visible length is rounded up to it, so that consecutive decode steps
// queue the same launch (and replay one graph) for this many positions.
const attnShortRound = 64

// attnShortDecode queues attn_short for one query row when the context is
// short enough that every key of a block's share fits its shared memory
// (one share a (kv head, head group), or attnShortShares merged in a
// cluster), and reports whether it did. With one share the blocks of a kv
// head form a cluster and multicast its rows to each other. A RoPE of
// exactly q and k queued just before it moves into the launch, as for
// attn_decode.
func (b *Backend) attnShortDecode(out, q, k, v backend.Buffer, c *kvCache, layer, pos0, visible int, s layers.AttentionShape) bool {
	G := s.Heads / s.KVHeads
	if G > attnShortWarps {
		return false
	}
	vr := (visible + attnShortRound - 1) / attnShortRound * attnShortRound
	rs := s.HeadDim + 4
	floats := func(kpb, gb, shares int) int { // attn_short's shared memory (as decode.cuh lays it out)
		f := max(kpb, attnShortWarps)*rs + kpb*rs + gb*s.HeadDim + gb*kpb + s.HeadDim
		if shares > 1 {
			f += shares * gb * (s.HeadDim + 4) // block 0's merge area (ATTD_PM)
		}
		return f
	}
	shares, kpb, hgroups := 0, 0, 1
	for S := 1; S <= attnShortShares && shares == 0; S++ {
		hg := b.attnHeadGroups(G, s.KVHeads, S)
		n, gb := (vr+S-1)/S, G/hg
		if n <= attnShortSlice*(attnShortWarps/gb) && 4*floats(n, gb, S) <= b.maxShare {
			shares, kpb, hgroups = S, n, hg
		}
	}
	if shares == 0 || shares > 1 && b.force.attnGlobal {
		return false
	}
	rowsOfBlocks := s.KVHeads * hgroups
	b.qmu.Lock()
	defer b.qmu.Unlock()
	a := b.attnRow(out, q, k, v, c, pos0, rowsOfBlocks*shares, s)
	name := fmt.Sprintf("attn_short_%d", s.HeadDim)
	o := op{kind: opKernel, name: name, fn: b.fn[name], grid: [3]uint32{uint32(rowsOfBlocks), uint32(shares), 1},
		block: 32 * attnShortWarps, shared: uint32(4 * floats(kpb, G/hgroups, shares)), pdl: pdlKernel(name)}
	// One share: a kv head's blocks share their copies of its rows (multicast).
	multicast := !b.force.attnNoCast && shares == 1 && hgroups > 1 && hgroups <= maxAttnCluster
	if shares > 1 {
		o.cluster = uint32(shares)
	}
	if multicast {
		o.clusterX = uint32(hgroups)
	}
	o.setParams(ptr(out), ptr(q), ptr(k), ptr(v), c.k[layer].ptr, c.v[layer].ptr, b.dyn.ptr, a.posRel,
		s.Heads, s.KVHeads, s.Scale, s.Window, kpb, a.freqs, a.rhalf, a.roff, a.rscale, a.rinter, a.qnw, a.knw, a.neps,
		hgroups, boolInt(shares > 1)|b.exp.attnAblate()|boolInt(multicast)<<2, c.lateRows(layer, pos0, b.pushed), a.trace)
	if !b.exp.attnSkip() {
		b.push(o)
	}
	return true
}

// attnScratch returns the split partials' array (at least parts floats) and,
// when tickets > 0, attn_decode's ticket array (at least that many counters,
// zero between launches), growing either as needed. A smaller array still
// queued stays alive through the queue's keep.
func (b *Backend) attnScratch(parts, tickets int) (part, ticket *allocation, err error) {
	b.partMu.Lock()
	defer b.partMu.Unlock()
	if b.attnPartLen < parts {
		a, err := b.alloc(4 * parts)
		if err != nil {
			return nil, nil, err
		}
		b.attnPart, b.attnPartLen = a, parts
	}
	if tickets > 0 && b.attnTicketLen < tickets {
		a, err := b.alloc(4 * tickets) // zeroed by alloc; each launch leaves it zero
		if err != nil {
			return nil, nil, err
		}
		b.attnTicket, b.attnTicketLen = a, tickets
	}
	return b.attnPart, b.attnTicket, nil
}
