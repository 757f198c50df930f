//go:build !amd64

package cpu

func dot4x3[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) {
	dot4x3Go(w, ldw, x, ldx, k, out)
}
