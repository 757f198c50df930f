//go:build !amd64 && !arm64

package cpu

func scores4(q, k []float32, stride, n, hd int, scale float32, out []float32) {
	scores4Go(q, k, stride, n, hd, scale, out)
}

func values4(acc, w, v []float32, stride, n, hd int) { values4Go(acc, w, v, stride, n, hd) }
