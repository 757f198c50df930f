// Package quant owns the number formats Manifold stores weights in and the
// conversions between them and float32: bfloat16, IEEE half precision
// (float16), FP8 E4M3 (the "fn" variant: no infinities, max 448), and NVFP4
// (E2M1 values with FP8 block scales).
//
// Scalar conversions (BF16ToFloat32, Float32ToF16, E4M3ToFloat32, ...) define
// the exact rounding every backend must reproduce: encoders round to nearest,
// ties to even. Bulk decoders and encoders (DecodeBF16, EncodeE4M3, ...) read
// and write little-endian bytes as stored in safetensors files and are used
// on hot paths.
//
// The package is pure computation: it must not do file I/O, know tensor
// names or layouts of checkpoints (package weights does), or depend on a
// compute backend. It holds no mutable package-level state.
package quant
