package cpu

import "golang.org/x/sys/cpu"

// hasAVX2 is fixed at start-up from the processor's feature flags.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func dotF32AVX2(x, w *float32, n int) float32

//go:noescape
func dotBF16AVX2(x *float32, w *uint16, n int) float32

func dotF32(x, w []float32) float32 {
	if hasAVX2 && len(x) > 0 {
		_ = w[len(x)-1]
		return dotF32AVX2(&x[0], &w[0], len(x))
	}
	return dotF32Go(x, w)
}

func dotBF16(x []float32, w []uint16) float32 {
	if hasAVX2 && len(x) > 0 {
		_ = w[len(x)-1]
		return dotBF16AVX2(&x[0], &w[0], len(x))
	}
	return dotBF16Go(x, w)
}
