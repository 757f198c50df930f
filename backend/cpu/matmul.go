package cpu

import "math"

// The matmul kernels compute out[i, r] = Σ_k x[i, k]·w[r, k] for output features
// r in [lo, hi). Each weight row is read from memory once and dotted with all
// m input rows while it is in cache. The dot products use AVX2/FMA assembly
// where the processor has it (dot_amd64.s), NEON on arm64 (dot_arm64.s), and
// the portable Go loops below otherwise; the tests hold both to the float64
// definition.

func matmulF32(out, x, w []float32, m, K, N, lo, hi int) {
	for r := lo; r < hi; r++ {
		wr := w[r*K : (r+1)*K]
		for i := 0; i < m; i++ {
			out[i*N+r] = dotF32(x[i*K:(i+1)*K], wr)
		}
	}
}

func dotF32Go(x, w []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+4 <= len(x); k += 4 {
		s0 += x[k] * w[k]
		s1 += x[k+1] * w[k+1]
		s2 += x[k+2] * w[k+2]
		s3 += x[k+3] * w[k+3]
	}
	for ; k < len(x); k++ {
		s0 += x[k] * w[k]
	}
	return (s0 + s1) + (s2 + s3)
}

func matmulBF16(out, x []float32, w []uint16, m, K, N, lo, hi int) {
	for r := lo; r < hi; r++ {
		wr := w[r*K : (r+1)*K]
		for i := 0; i < m; i++ {
			out[i*N+r] = dotBF16(x[i*K:(i+1)*K], wr)
		}
	}
}

func bf(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

func dotBF16Go(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	k := 0
	for ; k+4 <= len(x); k += 4 {
		s0 += x[k] * bf(w[k])
		s1 += x[k+1] * bf(w[k+1])
		s2 += x[k+2] * bf(w[k+2])
		s3 += x[k+3] * bf(w[k+3])
	}
	for ; k < len(x); k++ {
		s0 += x[k] * bf(w[k])
	}
	return (s0 + s1) + (s2 + s3)
}
