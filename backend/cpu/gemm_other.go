//go:build !amd64 && !arm64

package cpu

// has4x3: no SIMD 4x3 kernels here (dot4x3 takes dot4x3Go).
const has4x3 = false

func dot4x3BF16(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32) {
	panic("unreachable")
}

func dot4x3F32(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32) {
	panic("unreachable")
}

func matvecBF16(out, x []float32, w []uint16, K, lo, hi int) {
	matmulBF16(out, x, w, 1, K, len(out), lo, hi)
}

// forceAVX2 (the amd64 test hook) changes nothing here.
var forceAVX2 bool

// gemmWide (the amd64 AVX-512 bf16 prefill) is not here.
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool { return false }
