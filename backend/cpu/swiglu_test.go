package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/layers"
)

// TestSwiGLU holds swiglu (its assembly where the processor has it) to
// layers.SwiGLU bit for bit: gates over the whole float32 range, around
// the exponential's overflow and denormal bounds, zeros, infinities and
// NaN, lengths off 8 and 4, with and without a limit; the AVX2 kernel
// too where AVX-512 would take its place.
func TestSwiGLU(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 20))
	const n = 1<<20 + 5
	g, u := make([]float32, n), make([]float32, n)
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 87.3, -87.3, 88.7, -88.7, 103.9, -103.9, 708.39, -708.39,
		709.78, -709.78, 709.79, -709.79, 745.1, -745.2, 1e30, -1e30, math.MaxFloat32, -math.MaxFloat32,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, -1e-40}
	for i := range g {
		switch rng.IntN(4) {
		case 0:
			g[i] = float32(rng.NormFloat64() * 4)
		case 1:
			g[i] = float32((rng.Float64()*2 - 1) * 800)
		case 2:
			g[i] = math.Float32frombits(rng.Uint32()) // any bits
		default:
			g[i] = special[rng.IntN(len(special))]
		}
		u[i] = float32(rng.NormFloat64())
	}
	for _, avx2 := range []bool{false, true} {
		if avx2 && !hasAVX512VL {
			continue // swiglu took AVX2 already
		}
		forceAVX2 = avx2
		testSwiGLU(t, g, u)
		forceAVX2 = false
	}
}

func testSwiGLU(t *testing.T, g, u []float32) {
	n := len(g)
	for _, limit := range []float32{0, 7} {
		for _, m := range []int{n, 13, 8, 5, 3} {
			got, want := make([]float32, m), make([]float32, m)
			swiglu(got, g[:m], u[:m], limit)
			layers.SwiGLU(want, g[:m], u[:m], limit)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("limit %v n=%d: swiglu(%v, %v) = %v (%#x), layers.SwiGLU %v (%#x)", limit, m, g[i], u[i], got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
			}
		}
	}
}
