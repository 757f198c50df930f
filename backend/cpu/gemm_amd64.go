package cpu

//go:noescape
func dot4x3BF16AVX2(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4x3F32AVX2(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)

// dot4x3 is dot4x3Go with the AVX2 kernels where the processor has them; k
// is a multiple of 8.
func dot4x3[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) {
	if !hasAVX2 || k == 0 {
		dot4x3Go(w, ldw, x, ldx, k, out)
		return
	}
	_, _ = w[3*ldw+k-1], x[2*ldx+k-1]
	switch w := any(w).(type) {
	case []uint16:
		dot4x3BF16AVX2(&w[0], ldw, &x[0], ldx, k, out)
	case []float32:
		dot4x3F32AVX2(&w[0], ldw, &x[0], ldx, k, out)
	}
}
