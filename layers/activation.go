package layers

import "math"

// SiLU is x * sigmoid(x).
func SiLU(x float32) float32 {
	return x / (1 + float32(math.Exp(float64(-x))))
}

// SwiGLU writes silu(gate[i]) * up[i] into dst. When limit > 0 the inputs are
// clamped first as DeepSeek-V4's swiglu_limit does: gate to at most limit, up
// to [-limit, limit].
func SwiGLU(dst, gate, up []float32, limit float32) {
	for i := range dst {
		g, u := gate[i], up[i]
		if limit > 0 {
			g = min(g, limit)
			u = max(min(u, limit), -limit)
		}
		dst[i] = SiLU(g) * u
	}
}

// Argmax is the index of the first largest value of x (0 for an empty x).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// LogSumExp is log Σ_i exp(z[i]), computed stably in float64; z[t] minus it
// is log softmax(z)[t].
func LogSumExp(z []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range z {
		mx = max(mx, float64(v))
	}
	var s float64
	for _, v := range z {
		s += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(s)
}

// Softmax replaces x by its softmax, computed stably in float64.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		m = max(m, v)
	}
	var sum float64
	for i, v := range x {
		e := math.Exp(float64(v - m))
		x[i] = float32(e)
		sum += e
	}
	inv := 1 / sum
	for i := range x {
		x[i] = float32(float64(x[i]) * inv)
	}
}
