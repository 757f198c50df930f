package cpu

import "golang.org/x/sys/cpu"

// hasNEON is fixed at start-up: Advanced SIMD, which every arm64 processor
// Go runs on has; the float32, bf16 and int8 kernels of dot_arm64.s,
// gemm_arm64.s and nvfp4q8_arm64.s use it.
var hasNEON = cpu.ARM64.HasASIMD

//go:noescape
func dotF32NEON(x, w *float32, n int) float32

//go:noescape
func dotBF16NEON(x *float32, w *uint16, n int) float32

func dotF32(x, w []float32) float32 {
	n4 := len(x) &^ 3
	if !hasNEON || n4 == 0 {
		return dotF32Go(x, w)
	}
	_ = w[len(x)-1]
	s := dotF32NEON(&x[0], &w[0], n4)
	for k := n4; k < len(x); k++ {
		s += x[k] * w[k]
	}
	return s
}

func dotBF16(x []float32, w []uint16) float32 {
	n4 := len(x) &^ 3
	if !hasNEON || n4 == 0 {
		return dotBF16Go(x, w)
	}
	_ = w[len(x)-1]
	s := dotBF16NEON(&x[0], &w[0], n4)
	for k := n4; k < len(x); k++ {
		s += x[k] * bf(w[k])
	}
	return s
}
