package kernels

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// The cuBLAS path (issues 57 and 60): the prefill matmuls, where the own
// GEMMs run at 0.2-0.35x cuBLAS bf16 (docs/PERFORMANCE.md rows 5, 8, 14), go
// to cublasGemmEx when libcublas loads (New; Options.NoCuBLAS leaves it
// unloaded). Nothing links it: it is opened with purego like the driver, and
// its absence leaves every matmul on the own kernels (Name says which engine
// multiplies a prefill chunk).
//
// Precision is the own GEMMs', only the order of the float32 sums is
// cuBLAS's:
//   - bf16 (and f16) weights, m >= Options.CuBLASMinM: x is split into two
//     16-bit halves as gemm16 splits it (gemm16_x_bf16: hi = bf16(x), lo =
//     bf16(x - hi), 16 significant bits; DECISIONS.md: x rounded once would
//     move the golden logits by 0.03-4), and y = W·hi + W·lo, float32
//     accumulation (CUBLAS_COMPUTE_32F) and output: below blasStackedMaxM
//     rows one cublasGemmEx over hi and lo stacked (2m rows, the weight
//     read once) and blas_add_halves, from it two cublasGemmEx calls, the
//     second adding to the first (beta 1).
//   - NVFP4 weights, m >= Options.CuBLASNVFP4MinM: x rounded to fp16
//     (blas_x_f16, as gemm_x_h8 rounds it), the weight dequantized to fp16
//     (blas_nvfp4_f16: E2M1 x E4M3 is exact in fp16, cublas.cuh) in chunks of
//     rows into a scratch buffer, each chunk one cublasGemmEx, and the
//     global float32 scale, which would round the weights, passed as alpha.
//   - A bias is written into y first (blas_bias_rows) and the GEMMs add to
//     it, or blas_add_halves adds it.
//
// Layout. cuBLAS is column-major; the backend's matrices are row-major. A
// row-major a x b matrix is, read column-major, its b x a transpose with
// leading dimension b. So
//
//	y[m, N] = x[m, K] · W[N, K]ᵀ   (row-major)
//
// is, column-major, Yᶜ = yᵀ (N x m, ld N) = W · xᵀ, where W's row-major
// buffer read column-major is Wᵀ (K x N, ld K), taken with op T to give W
// (N x K), and x's is xᵀ (K x m, ld K), taken with op N. One call:
//
//	cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, m, K, &alpha,
//	             W, Atype, K, x16, Btype, K, &beta, y, CUDA_R_32F, N,
//	             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
//
// ("TN", cuBLAS's best-served layout). Rows n0 .. n0+r of the features are
// the same call with M = r, A = W + n0 K, C = y + n0, ldc still N.
//
// Queueing. A GEMM is an op of kind opBLAS in the launch queue, called when
// the queue launches (with the backend's context current and qmu held, on
// the backend's stream: cublasSetStream at New), in order with the kernels
// around it. A queue holding one is never captured as a CUDA graph (push
// drops its graph; launchQueued checks again): cuBLAS under stream capture
// is supported with a fixed workspace, which the handle has, but nothing the
// package graphs (decode steps at m = 1) reaches cuBLAS, and a batched step
// at m >= CuBLASMinM launches directly rather than depend on it.

// cuBLAS's constants (cublas_api.h, library_types.h).
const (
	cublasOpN         = 0
	cublasOpT         = 1
	cudaR32F          = 0
	cudaR16F          = 2
	cudaR16BF         = 14
	cublasCompute32F  = 68
	cublasGemmDefault = -1
)

// cublasMinMDefault is Options.CuBLASMinM's default: bf16 matmuls of this
// many rows or more on cuBLAS. At m = 64 the own GEMM was level with cuBLAS
// bf16 (docs/PERFORMANCE.md row 5, the NVFP4 GEMM's comparison; the bf16
// GEMM's own figure is 0.2x at m = 512), and the split x doubles cuBLAS's
// multiplies: the lead measures the crossing (BenchmarkCuBLASGEMM) and sets it.
const cublasMinMDefault = 64

// cublasNVFP4MinMDefault is Options.CuBLASNVFP4MinM's default: NVFP4 matmuls
// of this many rows or more dequantized onto cuBLAS. Provisional until
// measured (BenchmarkCuBLASGEMM: the own GEMM took 235 us at m = 512 on 4096
// x 14336 against cuBLAS bf16's 80.5, and the dequantization writes 117 MB).
const cublasNVFP4MinMDefault = 512

// blasStackedMaxM: bf16 matmuls of fewer rows run x's two halves as one
// GEMM over 2m rows (the weight read once) and add the halves after; from
// it, two GEMMs adding into y (gemmBLAS16). Provisional until measured
// (BenchmarkCuBLASGEMM's bf16-cublas-stacked and bf16-cublas-2gemm).
const blasStackedMaxM = 256

// blasStackedMaxC bounds the stacked path's scratch (floats): 256 MB.
const blasStackedMaxC = 64 << 20

// cublasWorkspace is the workspace given to the handle (cuBLAS recommends
// 32 MiB on Hopper), so that it never allocates one of its own.
const cublasWorkspace = 32 << 20

// blasChunkBytes bounds the dequantized weight scratch: whole weights up to
// 128 MiB of fp16 (every 8B-class matrix but the LM head), chunks of rows
// past that.
const blasChunkBytes = 128 << 20

// cublasLib is libcublas's entry points.
type cublasLib struct {
	path         string
	create       func(h *uintptr) int32
	destroy      func(h uintptr) int32
	setStream    func(h, stream uintptr) int32
	setWorkspace func(h uintptr, ws uint64, bytes uintptr) int32
	getVersion   func(h uintptr, v *int32) int32
	gemmEx       func(h uintptr, ta, tb, m, n, k int32, alpha unsafe.Pointer, a uint64, at, lda int32,
		b uint64, bt, ldb int32, beta unsafe.Pointer, c uint64, ct, ldc int32, compute, algo int32) int32
}

var loadCublas = sync.OnceValues(func() (*cublasLib, error) {
	lib, path, err := openCublas()
	if err != nil {
		return nil, err
	}
	l := &cublasLib{path: path}
	for _, f := range []struct {
		fn   any
		name string
	}{
		{&l.create, "cublasCreate_v2"}, {&l.destroy, "cublasDestroy_v2"}, {&l.setStream, "cublasSetStream_v2"},
		{&l.setWorkspace, "cublasSetWorkspace_v2"}, {&l.getVersion, "cublasGetVersion_v2"}, {&l.gemmEx, "cublasGemmEx"},
	} {
		sym, err := driverSym(lib, f.name)
		if err != nil {
			return nil, fmt.Errorf("%s lacks %s: %v", path, f.name, err)
		}
		bindFunc(f.fn, sym)
	}
	return l, nil
})

// blasKernels are the image's kernels the cuBLAS path launches.
var blasKernels = []string{"blas_nvfp4_f16", "blas_x_f16", "blas_bias_rows", "blas_add_halves", "gemm16_x_bf16", "gemm16_x_f16"}

// blasState is a backend's cuBLAS handle and scratch.
type blasState struct {
	lib       *cublasLib
	handle    uintptr
	version   int
	minM      int    // bf16 / f16 matmuls of m >= minM on cuBLAS (0: none)
	nvfp4MinM int    // NVFP4 matmuls of m >= nvfp4MinM dequantized onto cuBLAS (0: none)
	note      string // which engine multiplies a prefill chunk, for Name
	ws        *allocation

	// Guarded by partMu: x in 16 bits (two halves for bf16 weights), the
	// dequantized weight rows, the stacked bf16 GEMM's two halves of y.
	x16, w16, c          *allocation
	x16Len, w16Len, cLen int
}

// initBLAS loads libcublas and makes the backend's handle on its stream
// (the context current: cuBLAS's runtime takes the thread's current
// context, the primary one the backend retained). Any failure leaves the
// own kernels, noted for Name. After the module is loaded.
func (b *Backend) initBLAS(o Options) {
	s := &b.blas
	s.note = "own kernels"
	if o.cublasMinM() == 0 && o.cublasNVFP4MinM() == 0 {
		return
	}
	lib, err := loadCublas()
	if err != nil {
		s.note = "own kernels (no cuBLAS: " + err.Error() + ")"
		return
	}
	for _, name := range blasKernels {
		if _, err := b.lookup(name); err != nil {
			s.note = "own kernels (the kernel image lacks " + name + ", which cuBLAS's path needs)"
			return
		}
	}
	ws, err := b.alloc(cublasWorkspace)
	if err != nil {
		s.note = "own kernels (cuBLAS workspace: " + err.Error() + ")"
		return
	}
	var h uintptr
	var v int32
	b.d.onContext(b.ctx, func() {
		if r := lib.create(&h); r != 0 {
			err = fmt.Errorf("cublasCreate: status %d", r)
			h = 0
			return
		}
		if r := lib.setStream(h, b.stream); r != 0 {
			err = fmt.Errorf("cublasSetStream: status %d", r)
		} else if r := lib.setWorkspace(h, ws.ptr, cublasWorkspace); r != 0 {
			err = fmt.Errorf("cublasSetWorkspace: status %d", r)
		} else {
			lib.getVersion(h, &v)
		}
		if err != nil {
			lib.destroy(h)
			h = 0
		}
	})
	if err != nil {
		s.note = "own kernels (" + err.Error() + ")"
		return
	}
	s.lib, s.handle, s.version, s.ws = lib, h, int(v), ws
	s.minM, s.nvfp4MinM = o.cublasMinM(), o.cublasNVFP4MinM()
	at := func(m int) string {
		if m == 0 {
			return "never"
		}
		return fmt.Sprintf("m >= %d", m)
	}
	s.note = fmt.Sprintf("cuBLAS %d.%d.%d (%s) for bf16 at %s, NVFP4 at %s; own kernels below",
		v/10000, v/100%100, v%100, lib.path, at(s.minM), at(s.nvfp4MinM))
}

// closeBLAS destroys the handle. Context current, stream synchronized.
func (b *Backend) closeBLAS() {
	if s := &b.blas; s.handle != 0 {
		s.lib.destroy(s.handle)
		s.handle = 0
	}
}

// GEMMEngine says which engine multiplies prefill chunks: cuBLAS (its
// version, library and thresholds) or the own kernels, and why.
func (b *Backend) GEMMEngine() string { return b.blas.note }

// blasBF16 reports whether the matmul of a 16-bit weight of m rows goes to
// cuBLAS: loaded, m at the threshold (or forced: tests), no own GEMM
// variant forced, and the operands gemm16_x_* takes (K % 8 == 0, x
// 16-byte aligned).
func (b *Backend) blasBF16(x *Buffer, w *Weight, m int) bool {
	s, f := &b.blas, &b.force
	if s.handle == 0 || m < 2 || f.blasOff || w.cols%8 != 0 || x.ptr%16 != 0 {
		return false
	}
	if f.blasAll {
		return true
	}
	return s.minM > 0 && m >= s.minM && !f.g16All && f.g16Tile == 0 && f.g16Splits == 0
}

// blasNVFP4 reports whether the matmul of an NVFP4 weight of m rows is
// dequantized onto cuBLAS: as blasBF16, K % 16 == 0.
func (b *Backend) blasNVFP4(x *Buffer, w *Weight, m int) bool {
	s, f := &b.blas, &b.force
	if s.handle == 0 || m < 2 || f.blasOff || w.cols%16 != 0 || x.ptr%16 != 0 {
		return false
	}
	if f.blasAll {
		return true
	}
	return s.nvfp4MinM > 0 && m >= s.nvfp4MinM && !f.gemvOff && !f.gemmK128 && !f.gemmK256
}

// elementGrid is a grid-stride kernel's blocks of 256 threads for n units (the
// activation conversions and the cuBLAS helpers).
func (b *Backend) elementGrid(n int) [3]int { return [3]int{max(1, min((n+255)/256, 4*b.sms)), 1, 1} }

// gemmBLAS16 queues dst[m, N] = x[m, K]·wᵀ (+ bias) for a bf16 weight (f16:
// one stored in f16) on cuBLAS: x split into hi and lo halves
// (gemm16_x_bf16 / _f16, hi then lo, each row-major m x K: together one
// row-major 2m x K matrix), then W·hi + W·lo in one of two ways
// (blasStacked). Stacked: one GEMM over the 2m rows into a scratch c[2m,
// N], the weight read once, and blas_add_halves adds the halves and the
// bias (2m N floats written and read again: cheap where m is small, where
// the matmul is bound by the weight's bytes). Otherwise: the bias written
// into y (blas_bias_rows), then two GEMMs on m rows each, the second
// adding to the first (beta 1): the weight read twice, no scratch, where m
// is large and the multiplies bound it.
func (b *Backend) gemmBLAS16(dst, x *Buffer, w *Weight, m int, f16 bool) {
	N, K := w.rows, w.cols
	stacked := b.blasStacked(m, N)
	b.partMu.Lock()
	s := &b.blas
	err := b.grow(&s.x16, &s.x16Len, m*K) // two 16-bit halves a value: m K words
	if err == nil && stacked {
		err = b.grow(&s.c, &s.cLen, 2*m*N)
	}
	x16, c := s.x16, s.c
	b.partMu.Unlock()
	if err != nil {
		b.setErr(fmt.Errorf("kernels: cuBLAS matmul scratch for %d x %d, m = %d: %w", N, K, m, err))
		return
	}
	conv, typ := "gemm16_x_bf16", cudaR16BF
	if f16 {
		conv, typ = "gemm16_x_f16", cudaR16F
	}
	units := m * K / 8
	b.launch(conv, b.elementGrid(units), 256, 0, x16.ptr, x.ptr, units)
	hi, lo := x16.ptr, x16.ptr+uint64(2*m*K)
	if stacked {
		b.queueGemmEx(w.data.ptr, typ, hi, typ, c.ptr, N, 2*m, K, N, 1, 0)
		bias := uint64(0)
		if w.bias != nil {
			bias = w.bias.ptr
		}
		b.launch("blas_add_halves", b.elementGrid(m*N), 256, 0, dst.ptr, c.ptr, bias, m, N)
	} else {
		beta := b.blasBias(dst, w, m)
		b.queueGemmEx(w.data.ptr, typ, hi, typ, dst.ptr, N, m, K, N, 1, beta)
		b.queueGemmEx(w.data.ptr, typ, lo, typ, dst.ptr, N, m, K, N, 1, 1)
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, x16, c, w, x, dst)
	b.qmu.Unlock()
}

// blasStacked reports whether gemmBLAS16 runs x's halves as one GEMM over
// 2m rows (m < blasStackedMaxM and its scratch of 2m N floats within
// blasStackedMaxC; or forced: tests and benchmarks) rather than two GEMMs.
func (b *Backend) blasStacked(m, N int) bool {
	switch b.force.blasStacked {
	case 1:
		return true
	case 2:
		return false
	}
	return m < blasStackedMaxM && 2*m*N <= blasStackedMaxC
}

// blasChunkRows is how many weight rows of K one dequantized chunk holds: all
// N where they fit blasChunkBytes, else whole tiles of 128 (at least one).
func (b *Backend) blasChunkRows(N, K int) int {
	rows := blasChunkBytes / (2 * K)
	if b.force.blasChunk > 0 {
		rows = b.force.blasChunk
	}
	if rows >= N {
		return N
	}
	if b.force.blasChunk == 0 {
		rows = max(128, rows/128*128)
	}
	return min(rows, N)
}

// gemmBLASNVFP4 queues dst[m, N] = x[m, K]·wᵀ (+ bias) for an NVFP4 weight
// on cuBLAS: x rounded to fp16 (blas_x_f16), the bias, then per chunk of
// rows the chunk dequantized to fp16 (blas_nvfp4_f16) and its GEMM, alpha
// the global scale (the file's comment).
func (b *Backend) gemmBLASNVFP4(dst, x *Buffer, w *Weight, m int) {
	N, K := w.rows, w.cols
	rows := b.blasChunkRows(N, K)
	b.partMu.Lock()
	s := &b.blas
	err := b.grow(&s.x16, &s.x16Len, (m*K+1)/2) // fp16: m K / 2 words
	if err == nil {
		err = b.grow(&s.w16, &s.w16Len, rows*K/2)
	}
	x16, w16 := s.x16, s.w16
	b.partMu.Unlock()
	if err != nil {
		b.setErr(fmt.Errorf("kernels: cuBLAS NVFP4 matmul scratch for %d x %d, m = %d: %w", N, K, m, err))
		return
	}
	units := m * K / 8
	b.launch("blas_x_f16", b.elementGrid(units), 256, 0, x16.ptr, x.ptr, units)
	beta := b.blasBias(dst, w, m)
	for n0 := 0; n0 < N; n0 += rows {
		r := min(rows, N-n0)
		b.launch("blas_nvfp4_f16", b.elementGrid(r*K/8), 256, 0, w16.ptr, w.data.ptr+uint64(n0*K/2), w.scales.ptr+uint64(n0*K/16), r, K)
		b.queueGemmEx(w16.ptr, cudaR16F, x16.ptr, cudaR16F, dst.ptr+uint64(4*n0), r, m, K, N, w.global, beta)
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, x16, w16, w, x, dst)
	b.qmu.Unlock()
}

// blasBias writes w's bias into every row of dst when w has one and returns
// the beta of the first GEMM: 1 to add to it, else 0.
func (b *Backend) blasBias(dst *Buffer, w *Weight, m int) float32 {
	if w.bias == nil {
		return 0
	}
	N := w.rows
	b.launch("blas_bias_rows", b.elementGrid(m*N), 256, 0, dst.ptr, w.bias.ptr, m, N)
	return 1
}

// queueGemmEx queues gemmExOp's call.
func (b *Backend) queueGemmEx(a uint64, at int, bm uint64, bt int, c uint64, M, n, K, ldc int, alpha, beta float32) {
	o := gemmExOp(a, at, bm, bt, c, M, n, K, ldc, alpha, beta)
	b.qmu.Lock()
	b.push(o)
	b.qmu.Unlock()
}

// gemmExOp is the queue op of the column-major C[M, n] = alpha · op(A)·B +
// beta · C with op(A) = Aᵀ (A: K x M, ld K, type at), B: K x n (ld K, type
// bt), C float32 with leading dimension ldc: row-major, C[n, M] rows ldc
// apart = alpha · B[n, K]·A[M, K]ᵀ + beta · C (the file's comment).
func gemmExOp(a uint64, at int, bm uint64, bt int, c uint64, M, n, K, ldc int, alpha, beta float32) op {
	return op{kind: opBLAS, name: "cublasGemmEx", params: []uint64{a, bm, c, uint64(M), uint64(n), uint64(K), uint64(ldc),
		uint64(at), uint64(bt), uint64(math.Float32bits(alpha)), uint64(math.Float32bits(beta))}}
}

// gemmExArgs are cublasGemmEx's arguments (less the handle, the compute
// type and the algorithm) for a gemmExOp.
type gemmExArgs struct {
	transa, transb, m, n, k int32
	alpha, beta             float32
	a, b, c                 uint64
	atype, btype, ctype     int32
	lda, ldb, ldc           int32
}

func (o *op) gemmEx() gemmExArgs {
	p := o.params
	K := int32(p[5])
	return gemmExArgs{transa: cublasOpT, transb: cublasOpN, m: int32(p[3]), n: int32(p[4]), k: K,
		alpha: math.Float32frombits(uint32(p[9])), beta: math.Float32frombits(uint32(p[10])),
		a: p[0], b: p[1], c: p[2], atype: int32(p[7]), btype: int32(p[8]), ctype: cudaR32F, lda: K, ldb: K, ldc: int32(p[6])}
}

// launchBLAS calls cublasGemmEx for a queued opBLAS (queue.go: launchOp),
// with the context current and qmu held.
func (b *Backend) launchBLAS(o *op) {
	s := &b.blas
	if s.handle == 0 || len(o.params) != 11 {
		b.setErr(fmt.Errorf("kernels: a cuBLAS GEMM queued without a cuBLAS handle"))
		return
	}
	g := o.gemmEx()
	r := s.lib.gemmEx(s.handle, g.transa, g.transb, g.m, g.n, g.k, unsafe.Pointer(&g.alpha), g.a, g.atype, g.lda,
		g.b, g.btype, g.ldb, unsafe.Pointer(&g.beta), g.c, g.ctype, g.ldc, cublasCompute32F, cublasGemmDefault)
	if r != 0 {
		b.setErr(fmt.Errorf("kernels: cublasGemmEx (%d x %d x %d): cuBLAS status %d", g.m, g.n, g.k, r))
	}
}

// hasBLAS reports whether ops hold a cuBLAS call (never captured as a graph).
func hasBLAS(ops []op) bool {
	for i := range ops {
		if ops[i].kind == opBLAS {
			return true
		}
	}
	return false
}
