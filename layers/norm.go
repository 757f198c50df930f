package layers

import "math"

// RMSNorm writes x / sqrt(mean(x²) + eps) * w into dst, row by row. x and dst
// hold rows of len(w) values; dst may alias x. The sum of squares is taken in
// float64 so that the result does not depend on summation order.
func RMSNorm(dst, x, w []float32, eps float32) {
	n := len(w)
	for r := 0; r+n <= len(x); r += n {
		row := x[r : r+n]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(n)+float64(eps)))
		out := dst[r : r+n]
		for i, v := range row {
			out[i] = w[i] * (v * inv)
		}
	}
}

// LayerNorm writes (x - mean) / sqrt(var + eps) * w + b into dst, row by row,
// with rows of len(w) values. b may be nil.
func LayerNorm(dst, x, w, b []float32, eps float32) {
	n := len(w)
	for r := 0; r+n <= len(x); r += n {
		row := x[r : r+n]
		var sum float64
		for _, v := range row {
			sum += float64(v)
		}
		mean := sum / float64(n)
		var vs float64
		for _, v := range row {
			d := float64(v) - mean
			vs += d * d
		}
		inv := 1 / math.Sqrt(vs/float64(n)+float64(eps))
		out := dst[r : r+n]
		for i, v := range row {
			y := float32((float64(v)-mean)*inv) * w[i]
			if b != nil {
				y += b[i]
			}
			out[i] = y
		}
	}
}
