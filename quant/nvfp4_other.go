//go:build !amd64

package quant

const useAVX2 = false

func (m *NVFP4) matVecRowsAVX2(dst, x []float32, r0, r1 int) { m.matVecRowsGo(dst, x, r0, r1) }

// dot4Rows returns the dot products of x with the 4 rows of buf (row j at
// buf[j*k:]); len(x) == k.
func dot4Rows(buf, x []float32, k int) (out [4]float32) {
	out[0], out[1], out[2], out[3] = dot4(buf[0:k:k], buf[k:2*k:2*k], buf[2*k:3*k:3*k], buf[3*k:4*k:4*k], x)
	return out
}
