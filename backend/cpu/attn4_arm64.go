package cpu

// attn4Asm says whether the NEON kernels (attn4_arm64.s) take n rows of hd
// floats.
func attn4Asm(n, hd int) bool { return hasNEON && n > 0 && hd > 0 && hd%16 == 0 }

// max4Fast and exp4Fast: no assembly here (attend4's loops do every row).
func max4Fast(sc []float32, n int, mx *[4]float32) int { return 0 }

func exp4Fast(sc []float32, n4 int, mx, sum *[4]float32) {}
