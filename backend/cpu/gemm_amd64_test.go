package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestGemmWide holds the wide bf16 prefill (gemmWide: packWide and the
// 4x6 AVX-512 or 4x3 AVX2 kernel over row panels and k passes) to float64
// sums at token counts off the token groups, rows off the 4-row tiles and
// K off the steps, with panels and passes small enough that each shape
// crosses several, ragged at their ends. Tolerance as TestFloatKernels.
func TestGemmWide(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	for _, avx2 := range []bool{false, true} {
		if !avx2 && !hasAVX512 {
			continue
		}
		t.Run(fmt.Sprintf("avx2=%v", avx2), func(t *testing.T) {
			bf16ForceAVX2 = avx2
			defer func() { bf16ForceAVX2 = false }()
			testGemmWide(t)
		})
	}
}

func testGemmWide(t *testing.T) {
	defer func(kc, nc int) { wideKC, wideNC = kc, nc }(wideKC, wideNC)
	rng := rand.New(rand.NewPCG(61, 46))
	b := New(2)
	defer b.Close()
	for _, blocks := range [][2]int{{wideKC, wideNC}, {64, 8}, {96, 12}} {
		wideKC, wideNC = blocks[0], blocks[1]
		for _, s := range []struct{ m, K, N int }{{6, 32, 4}, {7, 136, 9}, {13, 200, 37}, {64, 1027, 30}, {17, 4096, 6}, {1, 64, 8}, {5, 16, 4}, {4, 23, 5}} {
			x := randn(rng, s.m*s.K)
			wb, w16 := truncBF16(randn(rng, s.N*s.K))
			out := make([]float32, s.m*s.N)
			if !b.gemmWide(out, x, &Weight{rows: s.N, cols: s.K, bf16: wb}, s.m) {
				t.Fatalf("%+v: gemmWide declined", s)
			}
			tol := 1e-5 * float64(s.K)
			name := fmt.Sprintf("%+v kc=%d nc=%d", s, wideKC, wideNC)
			for i := range s.m {
				for r := range s.N {
					d := dot64(x, w16, s.K, i, r)
					if got := float64(out[i*s.N+r]); math.Abs(got-d) > tol {
						t.Errorf("%s [%d,%d]: %v, want %v", name, i, r, got, d)
					}
				}
			}
		}
	}
}
