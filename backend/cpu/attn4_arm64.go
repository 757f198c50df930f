package cpu

//go:noescape
func scores4NEON(q, k *float32, stride, n, hd int, scale float32, out *float32)

//go:noescape
func values4NEON(acc, w, v *float32, stride, n, hd int)

// attn4Asm says whether the NEON kernels take n rows of hd floats.
func attn4Asm(n, hd int) bool { return hasNEON && n > 0 && hd > 0 && hd%16 == 0 }

// scores4Kernel and values4Kernel are the NEON kernels (attn4_simd.go
// checks their inputs).
func scores4Kernel(q, k *float32, stride, n, hd int, scale float32, out *float32) {
	scores4NEON(q, k, stride, n, hd, scale, out)
}

func values4Kernel(acc, w, v *float32, stride, n, hd int) { values4NEON(acc, w, v, stride, n, hd) }
