package quant

import "math"

// E8M0 (UE8M0, safetensors "F8_E8M0", torch.float8_e8m0fnu) is an unsigned
// power of two: code e is 2^(e-127). Code 0xff is NaN; code 0 is 2^-127, a
// float32 subnormal (bits 0x00400000), as ds4's and llama.cpp's decoders give.
// DeepSeek-V4 stores its FP8 128x128 block scales and its MXFP4 per-32 scales
// in it; the OCP MX spec uses it for every MX format.

// E8M0NaN is the E8M0 NaN code.
const E8M0NaN uint8 = 0xff

// E8M0ToFloat32 returns 2^(e-127), or NaN for code 0xff. The conversion is
// exact.
func E8M0ToFloat32(e uint8) float32 {
	switch e {
	case E8M0NaN:
		return float32(math.NaN())
	case 0:
		return math.Float32frombits(0x00400000)
	}
	return math.Float32frombits(uint32(e) << 23)
}

// Float32ToE8M0 returns the E8M0 code of f when f is a power of two in
// [2^-127, 2^127], and ok false otherwise (zero, negative, non-finite or not a
// power of two): the exact conversion a float32 power-of-two scale (the
// -Base checkpoints' ".scale" tensors) needs.
func Float32ToE8M0(f float32) (code uint8, ok bool) {
	b := math.Float32bits(f)
	switch {
	case b == 0x00400000:
		return 0, true
	case b&0x807fffff != 0 || b>>23 == 0 || b>>23 >= 0xff:
		return 0, false
	}
	return uint8(b >> 23), true
}
