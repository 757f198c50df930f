package cpu

//go:noescape
func axpyF32AVX2(y, x *float32, a float32, n int)

// axpyF32 adds a·x to y (len(x) values).
func axpyF32(y, x []float32, a float32) {
	if hasAVX2 && len(x) > 0 {
		_ = y[len(x)-1]
		axpyF32AVX2(&y[0], &x[0], a, len(x))
		return
	}
	axpyF32Go(y, x, a)
}
