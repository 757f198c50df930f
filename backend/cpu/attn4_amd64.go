package cpu

// attn4Asm says whether the AVX2 kernels (attn4_amd64.s) take n rows of hd
// floats.
func attn4Asm(n, hd int) bool { return hasAVX2 && n > 0 && hd > 0 && hd%16 == 0 }

//go:noescape
func max4AVX512(sc *float32, n int, mx *[4]float32)

//go:noescape
func exp4AVX512(sc *float32, n int, mx, sum *[4]float32)

//go:noescape
func max4AVX2(sc *float32, n int, mx *[4]float32)

//go:noescape
func exp4AVX2(sc *float32, n int, mx, sum *[4]float32)

// max4Fast takes the maxima of attend4's whole blocks of 4 rows into mx
// in AVX-512 (max4AVX512) or AVX2 (max4AVX2) where the processor has it,
// and returns the rows done (0 elsewhere); exp4Fast then does expf32 of
// those rows' scores minus the maxima in place and adds their sums to sum
// (exp4AVX512, exp4AVX2).
func max4Fast(sc []float32, n int, mx *[4]float32) int {
	n4 := n &^ 3
	if !hasAVX2 || n4 == 0 {
		return 0
	}
	_ = sc[4*n4-1]
	if hasAVX512VL && !forceAVX2 {
		max4AVX512(&sc[0], n4, mx)
	} else {
		max4AVX2(&sc[0], n4, mx)
	}
	return n4
}

func exp4Fast(sc []float32, n4 int, mx, sum *[4]float32) {
	if n4 == 0 {
		return
	}
	_ = sc[4*n4-1]
	if hasAVX512VL && !forceAVX2 {
		exp4AVX512(&sc[0], n4, mx, sum)
	} else {
		exp4AVX2(&sc[0], n4, mx, sum)
	}
}
