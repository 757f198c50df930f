package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// NVFP4 block size: 16 consecutive elements of a row share one E4M3 scale.
const NVFP4BlockSize = 16

// NVFP4GlobalDivisor is 6*448 = 2688, the product of the largest E2M1 and the
// largest E4M3 magnitudes. ModelOpt's per-tensor scale is
// weight_scale_2 = amax/2688; its reciprocal 2688/amax is what LightX2V and
// the CUTLASS kernels call the "global scale" (seed 004).
const NVFP4GlobalDivisor = E2M1Max * E4M3Max

// Errors of NVFP4 construction and quantization. They are wrapped with the
// details (shape, tensor); test them with errors.Is.
var (
	// ErrBlockAlign: the column count K (in features) is not a multiple of 16.
	ErrBlockAlign = errors.New("K (in features) is not a multiple of the NVFP4 block size 16")
	// ErrNonFinite: a weight to quantize, or a scale, is NaN or infinite.
	ErrNonFinite = errors.New("non-finite value")
	// ErrShape: buffer sizes disagree with the shape.
	ErrShape = errors.New("size does not match shape")
)

// NVFP4 is a rows x cols (N out features x K in features) matrix in NVFP4:
// each element is an E2M1 code, each run of 16 elements along a row shares an
// E4M3 block scale, and the whole matrix shares a float32 global scale:
//
//	W[r][k] = e2m1(Packed, r, k) * e4m3(Scales[r*K/16 + k/16]) * GlobalScale
//
// This is ModelOpt's layout and convention: Packed is the checkpoint's
// "weight" (U8 [N, K/2], even k in the low nibble), Scales its "weight_scale"
// (F8_E4M3 [N, K/16], plain row-major; see SwizzleScales for the tensor-core
// layout) and GlobalScale its "weight_scale_2" = amax(W)/2688, the reciprocal
// of the "global scale" 2688/amax used by LightX2V and CUTLASS.
//
// InputScale is ModelOpt's "input_scale" (activation amax/2688, the same
// multiply convention), or 0 when the checkpoint has none. The CPU backend
// does not quantize activations and ignores it; it is kept for GPU kernels
// that run FP4 x FP4 GEMMs.
type NVFP4 struct {
	Rows, Cols  int     // N (out features), K (in features); K % 16 == 0
	Packed      []byte  // [N, K/2] E2M1 pairs
	Scales      []byte  // [N, K/16] E4M3 block scales, plain row-major
	GlobalScale float32 // multiply: w = e2m1 * e4m3(scale) * GlobalScale
	InputScale  float32 // 0 if absent
}

// e4m3Table holds E4M3ToFloat32 of every code, e4m3HalfTable half of it (for
// kernels that work with 2*e2m1 integers); computed once at package
// initialization and only read afterwards.
var e4m3Table, e4m3HalfTable = newE4M3Tables()

func newE4M3Tables() (t, h [256]float32) {
	for i := range 256 {
		t[i] = E4M3ToFloat32(uint8(i))
		h[i] = t[i] / 2
	}
	return t, h
}

// NewNVFP4 checks and wraps existing NVFP4 data (plain row-major scales).
// The slices are used, not copied.
func NewNVFP4(rows, cols int, packed, scales []byte, globalScale, inputScale float32) (*NVFP4, error) {
	m := &NVFP4{Rows: rows, Cols: cols, Packed: packed, Scales: scales, GlobalScale: globalScale, InputScale: inputScale}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// NewNVFP4Swizzled is NewNVFP4 for block scales in the swizzled 128x4 layout
// (padded to SwizzledScaleShape). The scales are unswizzled into a new slice.
func NewNVFP4Swizzled(rows, cols int, packed, swizzled []byte, globalScale, inputScale float32) (*NVFP4, error) {
	if err := checkShape(rows, cols); err != nil {
		return nil, err
	}
	plain, err := UnswizzleScales(swizzled, rows, cols/NVFP4BlockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrShape, err)
	}
	return NewNVFP4(rows, cols, packed, plain, globalScale, inputScale)
}

func checkShape(rows, cols int) error {
	if rows <= 0 || cols <= 0 {
		return fmt.Errorf("nvfp4: shape %dx%d: %w", rows, cols, ErrShape)
	}
	if cols%NVFP4BlockSize != 0 {
		return fmt.Errorf("nvfp4: shape %dx%d: %w", rows, cols, ErrBlockAlign)
	}
	return nil
}

// Validate reports whether m is well formed: positive shape with K a multiple
// of 16, buffer sizes matching it, finite scales (no NaN block scale codes).
func (m *NVFP4) Validate() error {
	if err := checkShape(m.Rows, m.Cols); err != nil {
		return err
	}
	if want := m.Rows * m.Cols / 2; len(m.Packed) != want {
		return fmt.Errorf("nvfp4 %dx%d: packed data has %d bytes, want %d: %w", m.Rows, m.Cols, len(m.Packed), want, ErrShape)
	}
	if want := m.Rows * m.Cols / NVFP4BlockSize; len(m.Scales) != want {
		return fmt.Errorf("nvfp4 %dx%d: block scales have %d bytes, want %d: %w", m.Rows, m.Cols, len(m.Scales), want, ErrShape)
	}
	if !isFinite(m.GlobalScale) {
		return fmt.Errorf("nvfp4 %dx%d: global scale %v: %w", m.Rows, m.Cols, m.GlobalScale, ErrNonFinite)
	}
	if !isFinite(m.InputScale) {
		return fmt.Errorf("nvfp4 %dx%d: input scale %v: %w", m.Rows, m.Cols, m.InputScale, ErrNonFinite)
	}
	nb := m.Cols / NVFP4BlockSize
	for i, s := range m.Scales {
		if s&0x7f == 0x7f {
			return fmt.Errorf("nvfp4 %dx%d: block scale of row %d, block %d is NaN (code %#02x): %w",
				m.Rows, m.Cols, i/nb, i%nb, s, ErrNonFinite)
		}
	}
	return nil
}

func isFinite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// Clone returns a deep copy of m (for example to keep a matrix loaded from a
// memory-mapped checkpoint after the checkpoint is closed).
func (m *NVFP4) Clone() *NVFP4 {
	c := *m
	c.Packed = append([]byte(nil), m.Packed...)
	c.Scales = append([]byte(nil), m.Scales...)
	return &c
}

// Bytes returns the storage size of the packed values and block scales.
func (m *NVFP4) Bytes() int { return len(m.Packed) + len(m.Scales) }

// SwizzledScales returns the block scales in the swizzled 128x4 tensor-core
// layout (a new slice).
func (m *NVFP4) SwizzledScales() []byte {
	return SwizzleScales(m.Scales, m.Rows, m.Cols/NVFP4BlockSize)
}

// AbsMax returns the largest |w[i]| and whether every value is finite.
func AbsMax(w []float32) (amax float32, finite bool) {
	const mask = 0x7fffffff
	var mx uint32 // bit patterns of non-negative floats order like the values
	for _, v := range w {
		b := math.Float32bits(v) & mask
		if b > mx {
			mx = b
		}
	}
	return math.Float32frombits(mx), mx < 0x7f800000
}

// NVFP4GlobalScale returns the global scale ModelOpt derives from a tensor's
// absolute maximum: weight_scale_2 = amax/2688 (float32 arithmetic). For
// amax == 0 it returns 1, so that an all-zero tensor still has usable scales.
func NVFP4GlobalScale(amax float32) float32 {
	if amax == 0 {
		return 1
	}
	return amax / NVFP4GlobalDivisor
}

// QuantizeNVFP4 quantizes the row-major rows x cols matrix w to NVFP4 exactly
// as ModelOpt's NVFP4QTensor does: GlobalScale = amax/2688; each block of 16
// gets the E4M3 scale nearest to blockAmax/(6*GlobalScale) (1 for an all-zero
// block, at least 2^-9); each element becomes the E2M1 code nearest to
// w/(e4m3(scale)*GlobalScale), ties to even. It returns ErrBlockAlign if cols
// is not a multiple of 16 and ErrNonFinite if w holds NaN or Inf.
func QuantizeNVFP4(w []float32, rows, cols int) (*NVFP4, error) {
	return QuantizeNVFP4Parallel(w, rows, cols, 1)
}

// QuantizeNVFP4Parallel is QuantizeNVFP4 spread over workers goroutines
// (workers <= 0: GOMAXPROCS). The result does not depend on workers.
func QuantizeNVFP4Parallel(w []float32, rows, cols, workers int) (*NVFP4, error) {
	if err := checkShape(rows, cols); err != nil {
		return nil, err
	}
	if len(w) != rows*cols {
		return nil, fmt.Errorf("nvfp4: %d values for a %dx%d matrix: %w", len(w), rows, cols, ErrShape)
	}
	amax, finite := absMaxParallel(w, workers)
	if !finite {
		return nil, fmt.Errorf("nvfp4: %dx%d matrix: %w (NaN or Inf among the weights)", rows, cols, ErrNonFinite)
	}
	m := &NVFP4{
		Rows:        rows,
		Cols:        cols,
		Packed:      make([]byte, rows*cols/2),
		Scales:      make([]byte, rows*cols/NVFP4BlockSize),
		GlobalScale: NVFP4GlobalScale(amax),
	}
	ParallelRows(rows, workers, func(r0, r1 int) { m.QuantizeRows(w, r0, r1) })
	return m, nil
}

func absMaxParallel(w []float32, workers int) (float32, bool) {
	workers = numWorkers(workers)
	if workers == 1 || len(w) < 1<<16 {
		return AbsMax(w)
	}
	maxes := make([]float32, workers)
	oks := make([]bool, workers)
	chunk := (len(w) + workers - 1) / workers
	var wg sync.WaitGroup
	for i := range workers {
		lo, hi := min(i*chunk, len(w)), min((i+1)*chunk, len(w))
		wg.Go(func() { maxes[i], oks[i] = AbsMax(w[lo:hi]) })
	}
	wg.Wait()
	var amax float32
	for i := range workers {
		if !oks[i] {
			return 0, false
		}
		amax = max(amax, maxes[i])
	}
	return amax, true
}

// QuantizeRows quantizes rows [r0, r1) of the row-major matrix w (Rows x
// Cols) into m, using m.GlobalScale. w must hold finite values; rows of m
// outside [r0, r1) are untouched, so disjoint ranges may run concurrently.
func (m *NVFP4) QuantizeRows(w []float32, r0, r1 int) {
	m.quantizeRows(w, r0, r1, false)
}

// QuantizeRowsError is QuantizeRows that also returns, over the rows done,
// the sums of squares of (dequantized - w) and of w (see ErrorRows), computed
// during quantization instead of by a second pass.
func (m *NVFP4) QuantizeRowsError(w []float32, r0, r1 int) (errSq, refSq float64) {
	return m.quantizeRows(w, r0, r1, true)
}

func (m *NVFP4) quantizeRows(w []float32, r0, r1 int, withErr bool) (errSq, refSq float64) {
	k := m.Cols
	nb := k / NVFP4BlockSize
	gs := m.GlobalScale
	gs6 := 6 * gs
	for r := r0; r < r1; r++ {
		row := w[r*k : (r+1)*k]
		packed := m.Packed[r*k/2 : (r+1)*k/2]
		scales := m.Scales[r*nb : (r+1)*nb]
		for b := range nb {
			blk := row[b*16 : b*16+16 : b*16+16]
			bamax, _ := AbsMax(blk)
			s := bamax / gs6
			if s == 0 {
				s = 1
			}
			s = max(s, 1.0/512) // 2^-9, the smallest E4M3 subnormal
			code := Float32ToE4M3(s)
			scales[b] = code
			denom := e4m3Table[code] * gs
			out := packed[b*8 : b*8+8 : b*8+8]
			for j := range 8 {
				x0, x1 := blk[2*j], blk[2*j+1]
				c0, c1 := Float32ToE2M1(x0/denom), Float32ToE2M1(x1/denom)
				out[j] = PackE2M1(c0, c1)
				if withErr {
					d0 := float64(e2m1Values[c0]*denom) - float64(x0)
					d1 := float64(e2m1Values[c1]*denom) - float64(x1)
					errSq += d0*d0 + d1*d1
					refSq += float64(x0)*float64(x0) + float64(x1)*float64(x1)
				}
			}
		}
	}
	return errSq, refSq
}

// Dequantize returns the matrix as float32, row-major Rows x Cols.
func (m *NVFP4) Dequantize() []float32 {
	out := make([]float32, m.Rows*m.Cols)
	for r := range m.Rows {
		m.DequantizeRow(out[r*m.Cols:(r+1)*m.Cols], r)
	}
	return out
}

// DequantizeRow writes row r as float32 into dst (len >= Cols):
// e2m1 * (e4m3(scale) * GlobalScale), the operation order of ModelOpt's
// dequantize.
func (m *NVFP4) DequantizeRow(dst []float32, r int) {
	m.decodeRow(dst[:m.Cols], r, m.GlobalScale)
}

// decodeRow writes row r times the block scales times g into dst[:Cols].
func (m *NVFP4) decodeRow(dst []float32, r int, g float32) {
	k := m.Cols
	nb := k / NVFP4BlockSize
	packed := m.Packed[r*k/2 : (r+1)*k/2]
	scales := m.Scales[r*nb : (r+1)*nb]
	for b, sc := range scales {
		s := e4m3Table[sc] * g
		p := binary.LittleEndian.Uint64(packed[b*8:])
		d := dst[b*16 : b*16+16 : b*16+16]
		for j := range 8 {
			t := &e2m1Pair[uint8(p>>(8*j))]
			d[2*j] = t[0] * s
			d[2*j+1] = t[1] * s
		}
	}
}

// ErrorRows returns, over rows [r0, r1), the sums of squares of
// (dequantized - ref) and of ref, where ref is the row-major Rows x Cols
// matrix the quantization started from. It decodes one row at a time.
func (m *NVFP4) ErrorRows(ref []float32, r0, r1 int) (errSq, refSq float64) {
	buf := make([]float32, m.Cols)
	for r := r0; r < r1; r++ {
		m.DequantizeRow(buf, r)
		row := ref[r*m.Cols : (r+1)*m.Cols]
		for i, v := range row {
			d := float64(buf[i]) - float64(v)
			errSq += d * d
			refSq += float64(v) * float64(v)
		}
	}
	return errSq, refSq
}

// MatVecRows computes dst[r] = sum_k W[r,k]*x[k] for r in [r0, r1), decoding
// the weights on the fly (a 256-entry byte -> two-value table; the block
// scale is applied once per 16 products, the global scale once per row).
// len(x) must be at least Cols and len(dst) at least r1. Disjoint row ranges
// may run concurrently.
func (m *NVFP4) MatVecRows(dst, x []float32, r0, r1 int) {
	k := m.Cols
	if len(x) < k || r0 < 0 || r1 > m.Rows || len(dst) < r1 {
		panic(fmt.Sprintf("quant.NVFP4.MatVecRows: x has %d values (need %d), rows [%d,%d) of %d, dst has %d",
			len(x), k, r0, r1, m.Rows, len(dst)))
	}
	if useAVX2 {
		m.matVecRowsAVX2(dst, x, r0, r1)
		return
	}
	m.matVecRowsGo(dst, x, r0, r1)
}

// matVecRowsGo is the portable MatVecRows.
func (m *NVFP4) matVecRowsGo(dst, x []float32, r0, r1 int) {
	k := m.Cols
	x = x[:k]
	nb := k / NVFP4BlockSize
	half := k / 2
	for r := r0; r < r1; r++ {
		packed := m.Packed[r*half : (r+1)*half]
		scales := m.Scales[r*nb : (r+1)*nb]
		var acc0, acc1 float32
		b := 0
		for ; b+2 <= nb; b += 2 {
			acc0 += e4m3Table[scales[b]] * dot16(packed[b*8:], x[b*16:])
			acc1 += e4m3Table[scales[b+1]] * dot16(packed[b*8+8:], x[b*16+16:])
		}
		if b < nb {
			acc0 += e4m3Table[scales[b]] * dot16(packed[b*8:], x[b*16:])
		}
		dst[r] = (acc0 + acc1) * m.GlobalScale
	}
}

// dot16 returns sum_{i<16} e2m1(p, i) * x[i] for the 8 packed bytes at p.
func dot16(p []byte, x []float32) float32 {
	v := binary.LittleEndian.Uint64(p)
	x = x[:16:16]
	t0 := &e2m1Pair[uint8(v)]
	t1 := &e2m1Pair[uint8(v>>8)]
	t2 := &e2m1Pair[uint8(v>>16)]
	t3 := &e2m1Pair[uint8(v>>24)]
	t4 := &e2m1Pair[uint8(v>>32)]
	t5 := &e2m1Pair[uint8(v>>40)]
	t6 := &e2m1Pair[uint8(v>>48)]
	t7 := &e2m1Pair[uint8(v>>56)]
	s0 := t0[0]*x[0] + t0[1]*x[1]
	s1 := t1[0]*x[2] + t1[1]*x[3]
	s2 := t2[0]*x[4] + t2[1]*x[5]
	s3 := t3[0]*x[6] + t3[1]*x[7]
	s4 := t4[0]*x[8] + t4[1]*x[9]
	s5 := t5[0]*x[10] + t5[1]*x[11]
	s6 := t6[0]*x[12] + t6[1]*x[13]
	s7 := t7[0]*x[14] + t7[1]*x[15]
	return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
}

// matMulTile is the number of weight rows MatMulRows decodes at once and
// reuses across the rows of x.
const matMulTile = 4

// MatMulRows computes dst[i*Rows + r] = sum_k W[r,k]*x[i*Cols + k] for the m
// rows of x (row-major [m, Cols]) and r in [r0, r1); dst is row-major
// [m, Rows]. It decodes a tile of 4 weight rows at a time into a small
// float32 buffer (block and global scales folded in) and reuses it across
// all m rows of x, so the full float32 matrix is never built. For m == 1 it
// is MatVecRows. Disjoint row ranges may run concurrently.
func (m *NVFP4) MatMulRows(dst, x []float32, mrows int, r0, r1 int) {
	k, n := m.Cols, m.Rows
	if mrows < 0 || len(x) < mrows*k || r0 < 0 || r1 > n || len(dst) < mrows*n {
		panic(fmt.Sprintf("quant.NVFP4.MatMulRows: x has %d values (need %dx%d), rows [%d,%d) of %d, dst has %d (need %dx%d)",
			len(x), mrows, k, r0, r1, n, len(dst), mrows, n))
	}
	if mrows == 1 {
		m.MatVecRows(dst, x, r0, r1)
		return
	}
	if mrows == 0 || r0 >= r1 {
		return
	}
	buf := make([]float32, matMulTile*k)
	w0, w1, w2, w3 := buf[0:k:k], buf[k:2*k:2*k], buf[2*k:3*k:3*k], buf[3*k:4*k:4*k]
	r := r0
	for ; r+matMulTile <= r1; r += matMulTile {
		m.decodeRow(w0, r, m.GlobalScale)
		m.decodeRow(w1, r+1, m.GlobalScale)
		m.decodeRow(w2, r+2, m.GlobalScale)
		m.decodeRow(w3, r+3, m.GlobalScale)
		for i := range mrows {
			d := dot4Rows(buf, x[i*k:(i+1)*k:(i+1)*k], k)
			copy(dst[i*n+r:i*n+r+4], d[:])
		}
	}
	for ; r < r1; r++ {
		m.decodeRow(w0, r, m.GlobalScale)
		for i := range mrows {
			dst[i*n+r] = dot(w0, x[i*k:(i+1)*k])
		}
	}
}

// dot4 returns the dot products of x with w0..w3 (all of len(x)).
func dot4(w0, w1, w2, w3, x []float32) (float32, float32, float32, float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	i := 0
	for ; i+2 <= n; i += 2 {
		x0, x1 := x[i], x[i+1]
		a0 += w0[i] * x0
		a1 += w1[i] * x0
		a2 += w2[i] * x0
		a3 += w3[i] * x0
		b0 += w0[i+1] * x1
		b1 += w1[i+1] * x1
		b2 += w2[i+1] * x1
		b3 += w3[i+1] * x1
	}
	for ; i < n; i++ {
		a0 += w0[i] * x[i]
		a1 += w1[i] * x[i]
		a2 += w2[i] * x[i]
		a3 += w3[i] * x[i]
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}

func dot(w, x []float32) float32 {
	w = w[:len(x)]
	var a, b float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		a += w[i] * x[i]
		b += w[i+1] * x[i+1]
	}
	for ; i < len(x); i++ {
		a += w[i] * x[i]
	}
	return a + b
}

// MatVec computes dst = W x over all rows, split across workers goroutines
// (workers <= 0: GOMAXPROCS).
func (m *NVFP4) MatVec(dst, x []float32, workers int) {
	ParallelRows(m.Rows, workers, func(r0, r1 int) { m.MatVecRows(dst, x, r0, r1) })
}

// MatMul computes dst = x W^T for the mrows rows of x, split across workers
// goroutines by weight rows (workers <= 0: GOMAXPROCS).
func (m *NVFP4) MatMul(dst, x []float32, mrows, workers int) {
	ParallelRows(m.Rows, workers, func(r0, r1 int) { m.MatMulRows(dst, x, mrows, r0, r1) })
}

func numWorkers(workers int) int {
	if workers <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return workers
}

// ParallelRows splits [0, rows) into at most workers contiguous ranges
// (workers <= 0: GOMAXPROCS), multiples of 4 rows except the last, and runs
// fn on each in its own goroutine, returning when all are done. With one
// range it calls fn on the calling goroutine.
func ParallelRows(rows, workers int, fn func(r0, r1 int)) {
	workers = numWorkers(workers)
	chunk := roundUp((rows+workers-1)/max(workers, 1), matMulTile)
	if chunk >= rows {
		if rows > 0 {
			fn(0, rows)
		}
		return
	}
	var wg sync.WaitGroup
	for r0 := 0; r0 < rows; r0 += chunk {
		r1 := min(r0+chunk, rows)
		wg.Go(func() { fn(r0, r1) })
	}
	wg.Wait()
}
