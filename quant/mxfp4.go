package quant

import (
	"errors"
	"fmt"
	"math"
)

// MXFP4BlockSize is the OCP MX block: 32 consecutive elements of a row share
// one E8M0 scale.
const MXFP4BlockSize = 32

// ErrNotLossless: an MXFP4 matrix's block scales span more octaves than
// NVFP4's E4M3 block scales can hold under one global scale, so re-blocking
// it to NVFP4 would round. Wrapped with the details; test with errors.Is.
var ErrNotLossless = errors.New("MXFP4 scales do not fit NVFP4 exactly")

// MXFP4 is a Rows x Cols (N out features x K in features) matrix in the OCP
// MXFP4 format as DeepSeek-V4 stores its routed experts: E2M1 codes, two per
// byte with the even element in the low nibble (the same packing as NVFP4),
// and one E8M0 scale per 32 consecutive elements of a row:
//
//	W[r][k] = e2m1(Packed, r, k) * 2^(Scales[r*K/32 + k/32] - 127)
//
// Packed is the checkpoint's "weight" (I8 [N, K/2]), Scales its "scale"
// (F8_E8M0 [N, K/32]).
type MXFP4 struct {
	Rows, Cols int
	Packed     []byte // [N, K/2]
	Scales     []byte // [N, K/32] E8M0
}

// NewMXFP4 checks and wraps existing data; the slices are used, not copied.
func NewMXFP4(rows, cols int, packed, scales []byte) (*MXFP4, error) {
	m := &MXFP4{Rows: rows, Cols: cols, Packed: packed, Scales: scales}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// Validate reports whether m is well formed: positive shape with K a
// multiple of 32, buffer sizes matching it, no NaN scale.
func (m *MXFP4) Validate() error {
	if m.Rows <= 0 || m.Cols <= 0 || m.Cols%MXFP4BlockSize != 0 {
		return fmt.Errorf("mxfp4 %dx%d: K must be a positive multiple of %d: %w", m.Rows, m.Cols, MXFP4BlockSize, ErrShape)
	}
	if want := m.Rows * m.Cols / 2; len(m.Packed) != want {
		return fmt.Errorf("mxfp4 %dx%d: packed data has %d bytes, want %d: %w", m.Rows, m.Cols, len(m.Packed), want, ErrShape)
	}
	nb := m.Cols / MXFP4BlockSize
	if want := m.Rows * nb; len(m.Scales) != want {
		return fmt.Errorf("mxfp4 %dx%d: scales have %d bytes, want [%d, %d]: %w", m.Rows, m.Cols, len(m.Scales), m.Rows, nb, ErrScale)
	}
	for i, s := range m.Scales {
		if s == E8M0NaN {
			return fmt.Errorf("mxfp4 %dx%d: scale of row %d, block %d is NaN: %w", m.Rows, m.Cols, i/nb, i%nb, ErrNonFinite)
		}
	}
	return nil
}

// Bytes is the storage size of the codes and scales.
func (m *MXFP4) Bytes() int { return len(m.Packed) + len(m.Scales) }

// DequantizeRow writes row r as float32 into dst (len >= Cols).
func (m *MXFP4) DequantizeRow(dst []float32, r int) {
	k := m.Cols
	nb := k / MXFP4BlockSize
	packed := m.Packed[r*k/2 : (r+1)*k/2]
	for b, e := range m.Scales[r*nb : (r+1)*nb] {
		s := E8M0ToFloat32(e)
		d := dst[b*MXFP4BlockSize : (b+1)*MXFP4BlockSize]
		for j, p := range packed[b*MXFP4BlockSize/2 : (b+1)*MXFP4BlockSize/2] {
			t := &e2m1Pair[p]
			d[2*j] = t[0] * s
			d[2*j+1] = t[1] * s
		}
	}
}

// Dequantize returns the matrix as float32, row-major Rows x Cols.
func (m *MXFP4) Dequantize() []float32 { return dequantizeAll(m, m.Rows, m.Cols) }

// e4m3Pow2 maps k in [0, 17] to the E4M3 code of 2^(k-9): the powers of two
// E4M3 holds exactly, 2^-9 (the smallest subnormal) to 2^8.
func e4m3Pow2(k int) uint8 {
	if k < 3 { // subnormal: 2^(k-9) = m * 2^-9 with m = 1, 2, 4
		return uint8(1 << k)
	}
	return uint8(k-2) << 3 // normal: exponent field (k-9)+7
}

// ToNVFP4 re-blocks m as NVFP4 without rounding: the E2M1 codes are kept,
// each 32-element MX block becomes two 16-element NVFP4 blocks whose E4M3
// scale times the global scale is the block's 2^(e-127). The global scale is
// the power of two that puts the largest block scale at E4M3's 2^8, so every
// block scale within 17 octaves of the largest is exact (E4M3 holds 2^-9 to
// 2^8). A block whose codes are all zero gets scale 0. A nonzero block below
// that window gives an error wrapping ErrNotLossless.
//
// The result's Packed shares m's memory (the layouts are identical).
func (m *MXFP4) ToNVFP4() (*NVFP4, error) {
	emax := -1
	for i, e := range m.Scales {
		if int(e) > emax && !m.blockZero(i) {
			emax = int(e)
		}
	}
	q := &NVFP4{Rows: m.Rows, Cols: m.Cols, Packed: m.Packed, Scales: make([]byte, 2*len(m.Scales)), GlobalScale: 1}
	if emax < 0 { // all zero
		return q, nil
	}
	q.GlobalScale = pow2(emax - 127 - 8)
	for i, e := range m.Scales {
		var c uint8
		if !m.blockZero(i) {
			k := int(e) - emax + 17
			if k < 0 {
				return nil, fmt.Errorf("mxfp4 %dx%d: block %d of row %d has scale 2^%d, more than 17 octaves below the largest 2^%d: %w",
					m.Rows, m.Cols, i%(m.Cols/MXFP4BlockSize), i/(m.Cols/MXFP4BlockSize), int(e)-127, emax-127, ErrNotLossless)
			}
			c = e4m3Pow2(k)
		}
		q.Scales[2*i], q.Scales[2*i+1] = c, c
	}
	return q, nil
}

// blockZero reports whether MX block i holds only ±0 codes.
func (m *MXFP4) blockZero(i int) bool {
	for _, p := range m.Packed[i*MXFP4BlockSize/2 : (i+1)*MXFP4BlockSize/2] {
		if p&0x77 != 0 {
			return false
		}
	}
	return true
}

// pow2 returns 2^e as a float32 (e in [-149, 127]).
func pow2(e int) float32 {
	return float32(math.Ldexp(1, e))
}

// QuantizeMXFP4 quantizes the row-major rows x cols matrix w to MXFP4: each
// 32-element block gets the E8M0 scale 2^ceil(log2(amax/6)) (the smallest
// power of two that keeps amax within E2M1's ±6) and its values the nearest
// E2M1 code of w/scale. Non-finite weights give an error wrapping
// ErrNonFinite.
func QuantizeMXFP4(w []float32, rows, cols int) (*MXFP4, error) {
	if rows <= 0 || cols <= 0 || cols%MXFP4BlockSize != 0 || len(w) != rows*cols {
		return nil, fmt.Errorf("quantize mxfp4 %dx%d (%d values): %w", rows, cols, len(w), ErrShape)
	}
	m := &MXFP4{Rows: rows, Cols: cols, Packed: make([]byte, rows*cols/2), Scales: make([]byte, rows*cols/MXFP4BlockSize)}
	for b := range m.Scales {
		v := w[b*MXFP4BlockSize : (b+1)*MXFP4BlockSize]
		amax, ok := AbsMax(v)
		if !ok {
			return nil, fmt.Errorf("quantize mxfp4: row %d: %w", b/(cols/MXFP4BlockSize), ErrNonFinite)
		}
		m.Scales[b] = pow2Ceil(amax / E2M1Max)
		inv := 1 / E8M0ToFloat32(m.Scales[b])
		p := m.Packed[b*MXFP4BlockSize/2:]
		for j := 0; j < MXFP4BlockSize; j += 2 {
			p[j/2] = Float32ToE2M1(v[j]*inv) | Float32ToE2M1(v[j+1]*inv)<<4
		}
	}
	return m, nil
}
