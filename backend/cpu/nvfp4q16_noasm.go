//go:build !amd64

package cpu

// useQ16: the block-per-lane NVFP4 layout has AVX-512 VNNI kernels only.
func useQ16() bool { return false }

func dot4Q16(codes, scales []byte, a q16Act, groups int, out *[4]float32) {
	dot4Q16Go(codes, scales, a, groups, out)
}

func row4Q16(codes, scales []byte, a []q16Act, groups int, out *[4]float32) {
	row4Q16Go(codes, scales, a, groups, out)
}

func row8Q16(codes, scales []byte, a []q16Act, groups int, out *[8]float32) {
	row8Q16Go(codes, scales, a, groups, out)
}

// tile8Q16 and dotsQ16: no single-call kernels here (matmulQuads calls
// row8Q16 and dot4Q16 per row and quad).
func tile8Q16(out []float32, acts []q16Act, w *quadWeight, q0, q1 int) bool { return false }

func dotsQ16(out []float32, a q16Act, w *quadWeight, q0, q1 int) bool { return false }

// quantizeQ16Fast: no assembly here, quantizeQ16 does every block.
func quantizeQ16Fast(a q16Act, x []float32, groups int) int { return 0 }
