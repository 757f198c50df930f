package cpu

// attn4Asm says whether the AVX2 kernels (attn4_amd64.s) take n rows of hd
// floats.
func attn4Asm(n, hd int) bool { return hasAVX2 && n > 0 && hd > 0 && hd%16 == 0 }

//go:noescape
func max4AVX512(sc *float32, n int, mx *[4]float32)

//go:noescape
func exp4AVX512(sc *float32, n int, mx, sum *[4]float32)

// max4Fast takes the maxima of attend4's whole blocks of 4 rows into mx
// in AVX-512 (max4AVX512) where the processor has it, and returns the rows
// done (0 elsewhere); exp4Fast then does expf32 of those rows' scores
// minus the maxima in place and adds their sums to sum (exp4AVX512).
func max4Fast(sc []float32, n int, mx *[4]float32) int {
	n4 := n &^ 3
	if !hasAVX512VL || n4 == 0 {
		return 0
	}
	_ = sc[4*n4-1]
	max4AVX512(&sc[0], n4, mx)
	return n4
}

func exp4Fast(sc []float32, n4 int, mx, sum *[4]float32) {
	if n4 > 0 {
		_ = sc[4*n4-1]
		exp4AVX512(&sc[0], n4, mx, sum)
	}
}
