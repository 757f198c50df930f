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
