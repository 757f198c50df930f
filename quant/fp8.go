package quant

import (
	"fmt"
	"math"
)

// E4M3Max is the largest finite FP8 E4M3 (fn) value.
const E4M3Max = 448

// E4M3NaN is the canonical FP8 E4M3 NaN code; 0xff is NaN too.
const E4M3NaN uint8 = 0x7f

// E4M3ToFloat32 returns the float32 value of the FP8 E4M3 (fn variant) code b:
// 1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits, no infinities;
// 0x7f and 0xff are NaN. The conversion is exact.
func E4M3ToFloat32(b uint8) float32 {
	sign := uint32(b&0x80) << 24
	em := uint32(b & 0x7f)
	switch {
	case em == 0x7f:
		return math.Float32frombits(sign | 0x7fc00000)
	case em < 8: // zero or subnormal: m * 2^-9
		return math.Float32frombits(sign | math.Float32bits(float32(em)*(1.0/512)))
	}
	// Normal: exponent e (bias 7) -> e+120 (bias 127), mantissa to the top.
	return math.Float32frombits(sign | (em<<20 + 120<<23))
}

// Float32ToE4M3 returns the FP8 E4M3 (fn) code nearest to f, rounding ties to
// even and saturating finite and infinite values beyond ±448 to ±448, like
// PTX cvt.rn.satfinite.e4m3x2.f32. NaN becomes 0x7f.
func Float32ToE4M3(f float32) uint8 {
	b := math.Float32bits(f)
	sign := uint8(b>>24) & 0x80
	a := b & 0x7fffffff
	switch {
	case a > 0x7f800000:
		return E4M3NaN
	case a >= 0x43e00000: // >= 448 (includes Inf)
		return sign | 0x7e
	case a < 0x3c800000: // < 2^-6: subnormal range, step 2^-9
		q := math.RoundToEven(float64(math.Float32frombits(a)) * 512)
		return sign | uint8(q) // q in [0, 8]; 8 is the smallest normal, code 0x08
	}
	// Normal: keep 3 mantissa bits, round to nearest even on the 20 dropped bits.
	a += 0x7ffff + (a>>20)&1
	code := a>>20 - 120<<3
	if code > 0x7e {
		code = 0x7e
	}
	return sign | uint8(code)
}

// DecodeE4M3 converts len(dst) FP8 E4M3 codes from src into dst. src must hold
// at least len(dst) bytes; a shorter src panics.
func DecodeE4M3(dst []float32, src []byte) {
	if len(src) < len(dst) {
		panic(fmt.Sprintf("quant.DecodeE4M3: src has %d bytes, need %d", len(src), len(dst)))
	}
	src = src[:len(dst)]
	if len(src) < 1024 {
		for i, b := range src {
			dst[i] = E4M3ToFloat32(b)
		}
		return
	}
	// For long inputs a 1 KiB table, built on the stack, beats the branches.
	var lut [256]float32
	for i := range lut {
		lut[i] = E4M3ToFloat32(uint8(i))
	}
	for i, b := range src {
		dst[i] = lut[b]
	}
}

// EncodeE4M3 converts src to FP8 E4M3 codes (round to nearest even,
// saturating) into dst. dst must hold at least len(src) bytes; a shorter dst
// panics.
func EncodeE4M3(dst []byte, src []float32) {
	if len(dst) < len(src) {
		panic(fmt.Sprintf("quant.EncodeE4M3: dst has %d bytes, need %d", len(dst), len(src)))
	}
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = Float32ToE4M3(f)
	}
}
