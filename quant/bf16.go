package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BF16ToFloat32 returns the float32 value of the bfloat16 bit pattern h.
// The conversion is exact.
func BF16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// Float32ToBF16 returns the bfloat16 bit pattern nearest to f, rounding ties
// to even. Values beyond the bfloat16 range become ±Inf; NaN stays NaN (a
// quiet NaN with the sign and the upper payload bits of f).
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it NaN even if the payload is in the low bits.
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// DecodeBF16 converts len(dst) little-endian bfloat16 values from src into
// dst. src must hold at least 2*len(dst) bytes; a shorter src is a programming
// error and panics.
func DecodeBF16(dst []float32, src []byte) {
	n := len(dst)
	if len(src) < 2*n {
		panic(fmt.Sprintf("quant.DecodeBF16: src has %d bytes, need %d for %d values", len(src), 2*n, n))
	}
	src = src[:2*n]
	i := 0
	for ; i+4 <= n; i += 4 {
		v := binary.LittleEndian.Uint64(src[2*i:])
		d := dst[i : i+4 : i+4]
		d[0] = math.Float32frombits(uint32(v) << 16)
		d[1] = math.Float32frombits(uint32(v>>16) << 16)
		d[2] = math.Float32frombits(uint32(v>>32) << 16)
		d[3] = math.Float32frombits(uint32(v>>48) << 16)
	}
	for ; i < n; i++ {
		dst[i] = math.Float32frombits(uint32(src[2*i])<<16 | uint32(src[2*i+1])<<24)
	}
}

// EncodeBF16 converts src to little-endian bfloat16 (round to nearest even)
// into dst. dst must hold at least 2*len(src) bytes; a shorter dst panics.
func EncodeBF16(dst []byte, src []float32) {
	n := len(src)
	if len(dst) < 2*n {
		panic(fmt.Sprintf("quant.EncodeBF16: dst has %d bytes, need %d for %d values", len(dst), 2*n, n))
	}
	dst = dst[:2*n]
	for i, f := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBF16(f))
	}
}
