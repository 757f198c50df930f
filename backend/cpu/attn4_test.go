package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestExpF32: expf32 within 2 float32 ulp of e^x (in float64, rounded) over
// the softmax's range, and its ends.
func TestExpF32(t *testing.T) {
	for i := range 200001 {
		x := -90 + float32(i)*(90.0/200000)
		got, want := expf32(x), float32(math.Exp(float64(x)))
		if want < math.SmallestNonzeroFloat32*(1<<23) { // subnormal: flushed to 0
			if got != 0 && math.Abs(float64(got-want)) > 1e-38 {
				t.Fatalf("expf32(%v) = %v, want %v", x, got, want)
			}
			continue
		}
		if ulp := math.Abs(float64(got-want)) / float64(math.Nextafter32(want, 2*want)-want); ulp > 2 {
			t.Fatalf("expf32(%v) = %v, want %v (%.1f ulp)", x, got, want, ulp)
		}
	}
	if expf32(0) != 1 || expf32(float32(math.Inf(-1))) != 0 || !math.IsInf(float64(expf32(100)), 1) {
		t.Errorf("expf32 ends: %v %v %v", expf32(0), expf32(float32(math.Inf(-1))), expf32(100))
	}
}

// TestAttn4Kernels holds scores4 and values4 (the AVX2 kernels where they
// apply) to the portable Go ones, on head dims on and off the kernels' 16.
func TestAttn4Kernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 4))
	for _, s := range [][3]int{{1, 16, 16}, {7, 64, 256}, {33, 48, 100}, {130, 128, 512}, {5, 40, 40}} {
		n, hd, stride := s[0], s[1], s[2]
		q, k := randn(rng, 4*hd), randn(rng, (n-1)*stride+hd)
		t.Run(fmt.Sprint(s), func(t *testing.T) {
			got, want := make([]float32, 4*n), make([]float32, 4*n)
			scores4(q, k, stride, n, hd, 0.125, got)
			scores4Go(q, k, stride, n, hd, 0.125, want)
			closeF32(t, "scores4", got, want, 1e-5)
			acc, accGo := make([]float32, 4*hd), make([]float32, 4*hd)
			values4(acc, got, k, stride, n, hd)
			values4Go(accGo, got, k, stride, n, hd)
			closeF32(t, "values4", acc, accGo, 1e-5)
		})
	}
}

// closeF32 fails when |got-want| > tol*(1+|want|) anywhere.
func closeF32(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}
