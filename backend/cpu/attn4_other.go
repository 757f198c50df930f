//go:build !amd64 && !arm64

package cpu

func scores4(q, k []float32, stride, n, hd int, scale float32, out []float32) {
	scores4Go(q, k, stride, n, hd, scale, out)
}

func values4(acc, w, v []float32, stride, n, hd int) { values4Go(acc, w, v, stride, n, hd) }

// max4Fast and exp4Fast: no assembly here (attend4's loops do every row).
func max4Fast(sc []float32, n int, mx *[4]float32) int { return 0 }

func exp4Fast(sc []float32, n4 int, mx, sum *[4]float32) {}
