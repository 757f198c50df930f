package cpu

//go:noescape
func scores4AVX2(q, k *float32, stride, n, hd int, scale float32, out *float32)

//go:noescape
func values4AVX2(acc, w, v *float32, stride, n, hd int)

// attn4Asm says whether the AVX2 kernels take n rows of hd floats.
func attn4Asm(n, hd int) bool { return hasAVX2 && n > 0 && hd > 0 && hd%16 == 0 }

// scores4Kernel and values4Kernel are the AVX2 kernels (attn4_simd.go
// checks their inputs).
func scores4Kernel(q, k *float32, stride, n, hd int, scale float32, out *float32) {
	scores4AVX2(q, k, stride, n, hd, scale, out)
}

func values4Kernel(acc, w, v *float32, stride, n, hd int) { values4AVX2(acc, w, v, stride, n, hd) }
