package cpu

// attn4Asm says whether the AVX2 kernels (attn4_amd64.s) take n rows of hd
// floats.
func attn4Asm(n, hd int) bool { return hasAVX2 && n > 0 && hd > 0 && hd%16 == 0 }
