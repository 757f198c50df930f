package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// F16ToFloat32 returns the float32 value of the IEEE 754 half-precision bit
// pattern h. The conversion is exact; NaNs stay NaN with sign and payload.
func F16ToFloat32(h uint16) float32 {
	return math.Float32frombits(f16Bits(h))
}

// f16Bits converts half bits to float32 bits without branches on the common
// path: the exponent is rebiased by an add, subnormals are normalized by one
// float subtraction, Inf/NaN get the remaining exponent bump.
func f16Bits(h uint16) uint32 {
	const magic = 113 << 23 // 2^-14 as float32 bits
	o := uint32(h&0x7fff) << 13
	exp := o & 0x0f800000
	o += (127 - 15) << 23
	switch exp {
	case 0x0f800000: // Inf or NaN
		o += (128 - 16) << 23
	case 0: // zero or subnormal
		o += 1 << 23
		o = math.Float32bits(math.Float32frombits(o) - math.Float32frombits(magic))
	}
	return o | uint32(h&0x8000)<<16
}

// Float32ToF16 returns the half-precision bit pattern nearest to f, rounding
// ties to even. Values beyond the half range become ±Inf, values below half
// the smallest subnormal become ±0, NaN stays NaN.
func Float32ToF16(f float32) uint16 {
	return float16.Fromfloat32(f).Bits()
}

// DecodeF16 converts len(dst) little-endian half-precision values from src
// into dst. src must hold at least 2*len(dst) bytes; a shorter src panics.
func DecodeF16(dst []float32, src []byte) {
	n := len(dst)
	if len(src) < 2*n {
		panic(fmt.Sprintf("quant.DecodeF16: src has %d bytes, need %d for %d values", len(src), 2*n, n))
	}
	src = src[:2*n]
	for i := range dst {
		dst[i] = math.Float32frombits(f16Bits(uint16(src[2*i]) | uint16(src[2*i+1])<<8))
	}
}

// EncodeF16 converts src to little-endian half precision (round to nearest
// even) into dst. dst must hold at least 2*len(src) bytes; a shorter dst
// panics.
func EncodeF16(dst []byte, src []float32) {
	n := len(src)
	if len(dst) < 2*n {
		panic(fmt.Sprintf("quant.EncodeF16: dst has %d bytes, need %d for %d values", len(dst), 2*n, n))
	}
	dst = dst[:2*n]
	for i, f := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToF16(f))
	}
}
