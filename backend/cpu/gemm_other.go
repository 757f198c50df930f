//go:build !amd64 && !arm64

package cpu

func dot4x3[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) int {
	dot4x3Go(w, ldw, x, ldx, k, out)
	return k
}

func matvecBF16(out, x []float32, w []uint16, K, lo, hi int) {
	matmulBF16(out, x, w, 1, K, len(out), lo, hi)
}

// bf16ForceAVX2 (the amd64 test hook) changes nothing here.
var bf16ForceAVX2 bool

// gemmWide (the amd64 AVX-512 bf16 prefill) is not here.
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool { return false }
