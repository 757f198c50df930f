package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFloatKernels holds the float32 and bf16 kernels a default path
// dispatches to (AVX2 on amd64, NEON on arm64, Go elsewhere) to float64
// sums: the 4x3 prefill tile (dot4x3: its 8 partial sums a pair), the bf16
// matvec (matvecBF16: 4-row passes, leftover rows and the tail of K in Go),
// and MatMul's GEMM path (gemmRows) for K and row counts off the tiles.
// Tolerance: float32 accumulation over K terms of unit size, 1e-5*K (as
// TestMatMul). On amd64 with AVX-512 both its matvec kernels and the AVX2
// ones (forceAVX2); its prefill GEMM is TestGemmWide's.
func TestFloatKernels(t *testing.T) {
	for _, force := range []bool{false, true} {
		forceAVX2 = force
		testFloatKernels(t)
	}
	forceAVX2 = false
}

func testFloatKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 64))
	for _, s := range []struct{ m, K, N int }{{3, 8, 4}, {3, 64, 4}, {7, 136, 9}, {1, 1000, 11}, {8, 1027, 6}, {5, 4096, 5}} {
		w := randn(rng, s.N*s.K)
		x := randn(rng, s.m*s.K)
		wb, w16 := truncBF16(w)
		want := func(wf []float32, i, r int) float64 { return dot64(x, wf, s.K, i, r) }
		tol := 1e-5 * float64(s.K)
		name := fmt.Sprintf("%+v avx2=%v", s, forceAVX2)
		if k8 := s.K &^ 7; s.m >= 3 && s.N >= 4 && k8 > 0 {
			var acc [96]float32
			for _, bf16 := range []bool{false, true} {
				if bf16 {
					dot4x3(wb, s.K, x, s.K, k8, &acc)
				} else {
					dot4x3(w, s.K, x, s.K, k8, &acc)
				}
				for r := range 4 {
					for tk := range 3 {
						var got, d float64
						for _, v := range acc[(3*r+tk)*8 : (3*r+tk+1)*8] {
							got += float64(v)
						}
						for k := range k8 {
							wv := w[r*s.K+k]
							if bf16 {
								wv = w16[r*s.K+k]
							}
							d += float64(x[tk*s.K+k]) * float64(wv)
						}
						if math.Abs(got-d) > tol {
							t.Errorf("%s dot4x3 bf16=%v row %d token %d: %v, want %v", name, bf16, r, tk, got, d)
						}
					}
				}
			}
		}
		out := make([]float32, s.N)
		matvecBF16(out, x[:s.K], wb, s.K, 0, s.N)
		for r := range s.N {
			if d := want(w16, 0, r); math.Abs(float64(out[r])-d) > tol {
				t.Errorf("%s matvecBF16 row %d: %v, want %v", name, r, out[r], d)
			}
		}
		outm := make([]float32, s.m*s.N)
		gemmRows(outm, x, wb, s.m, s.K, s.N, 0, s.N, dotBF16)
		outf := make([]float32, s.m*s.N)
		gemmRows(outf, x, w, s.m, s.K, s.N, 0, s.N, dotF32)
		for i := range s.m {
			for r := range s.N {
				if d := want(w16, i, r); math.Abs(float64(outm[i*s.N+r])-d) > tol {
					t.Errorf("%s gemmRows bf16 [%d,%d]: %v, want %v", name, i, r, outm[i*s.N+r], d)
				}
				if d := want(w, i, r); math.Abs(float64(outf[i*s.N+r])-d) > tol {
					t.Errorf("%s gemmRows f32 [%d,%d]: %v, want %v", name, i, r, outf[i*s.N+r], d)
				}
			}
		}
	}
}

// truncBF16 is w truncated to bf16 (the kernels' input) and those values
// as float32 (the reference's).
func truncBF16(w []float32) ([]uint16, []float32) {
	wb, w16 := make([]uint16, len(w)), make([]float32, len(w))
	for i, v := range w {
		wb[i] = uint16(math.Float32bits(v) >> 16)
		w16[i] = bf(wb[i])
	}
	return wb, w16
}

// dot64 is token i of x times row r of w (K values each) in float64.
func dot64(x, w []float32, K, i, r int) float64 {
	var d float64
	for k := range K {
		d += float64(x[i*K+k]) * float64(w[r*K+k])
	}
	return d
}
