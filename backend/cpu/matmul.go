package cpu

import "math"

// The matmul kernels compute out[i, r] = Σ_k x[i, k]·w[r, k] for output features
// r in [lo, hi). With m = 1 (decoding) they stream each weight row once with
// several independent accumulators; with m > 1 (prefill) they take four weight
// rows at a time and reuse each loaded weight value across the four rows while
// it is in registers, so the weights are read from memory once per call.

func matmulF32(out, x, w []float32, m, K, N, lo, hi int) {
	r := lo
	for ; r+4 <= hi; r += 4 {
		w0, w1, w2, w3 := w[r*K:(r+1)*K], w[(r+1)*K:(r+2)*K], w[(r+2)*K:(r+3)*K], w[(r+3)*K:(r+4)*K]
		for i := 0; i < m; i++ {
			o := out[i*N+r : i*N+r+4]
			o[0], o[1], o[2], o[3] = dot4F32(x[i*K:(i+1)*K], w0, w1, w2, w3)
		}
	}
	for ; r < hi; r++ {
		for i := 0; i < m; i++ {
			out[i*N+r] = dotF32(x[i*K:(i+1)*K], w[r*K:(r+1)*K])
		}
	}
}

func dotF32(x, w []float32) float32 {
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

func dot4F32(x, w0, w1, w2, w3 []float32) (float32, float32, float32, float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	k := 0
	for ; k+2 <= n; k += 2 {
		x0, x1 := x[k], x[k+1]
		a0 += x0 * w0[k]
		a1 += x0 * w1[k]
		a2 += x0 * w2[k]
		a3 += x0 * w3[k]
		b0 += x1 * w0[k+1]
		b1 += x1 * w1[k+1]
		b2 += x1 * w2[k+1]
		b3 += x1 * w3[k+1]
	}
	for ; k < n; k++ {
		a0 += x[k] * w0[k]
		a1 += x[k] * w1[k]
		a2 += x[k] * w2[k]
		a3 += x[k] * w3[k]
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}

func matmulBF16(out, x []float32, w []uint16, m, K, N, lo, hi int) {
	r := lo
	for ; r+4 <= hi; r += 4 {
		w0, w1, w2, w3 := w[r*K:(r+1)*K], w[(r+1)*K:(r+2)*K], w[(r+2)*K:(r+3)*K], w[(r+3)*K:(r+4)*K]
		for i := 0; i < m; i++ {
			o := out[i*N+r : i*N+r+4]
			o[0], o[1], o[2], o[3] = dot4BF16(x[i*K:(i+1)*K], w0, w1, w2, w3)
		}
	}
	for ; r < hi; r++ {
		for i := 0; i < m; i++ {
			out[i*N+r] = dotBF16(x[i*K:(i+1)*K], w[r*K:(r+1)*K])
		}
	}
}

func bf(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

func dotBF16(x []float32, w []uint16) float32 {
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

func dot4BF16(x []float32, w0, w1, w2, w3 []uint16) (float32, float32, float32, float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	k := 0
	for ; k+2 <= n; k += 2 {
		x0, x1 := x[k], x[k+1]
		a0 += x0 * bf(w0[k])
		a1 += x0 * bf(w1[k])
		a2 += x0 * bf(w2[k])
		a3 += x0 * bf(w3[k])
		b0 += x1 * bf(w0[k+1])
		b1 += x1 * bf(w1[k+1])
		b2 += x1 * bf(w2[k+1])
		b3 += x1 * bf(w3[k+1])
	}
	for ; k < n; k++ {
		a0 += x[k] * bf(w0[k])
		a1 += x[k] * bf(w1[k])
		a2 += x[k] * bf(w2[k])
		a3 += x[k] * bf(w3[k])
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}
