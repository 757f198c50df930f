package cpu

// attn4Asm says whether the NEON kernels (attn4_arm64.s) take n rows of hd
// floats.
func attn4Asm(n, hd int) bool { return hasNEON && n > 0 && hd > 0 && hd%16 == 0 }
