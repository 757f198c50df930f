package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestGemmWide holds the bf16 prefill kernels of amd64 (gemmWide: the
// AVX-512 packWide and 4x6 kernel over row panels and k passes; without
// AVX-512 gemmPacked: rows widened a pass at a time, 4x3 tiles over packed
// x, blocks of token groups) to float64 sums at token counts off the token
// groups, rows off the 4-row tiles and K off the steps, with panels,
// passes and blocks small enough that each shape crosses several, ragged
// at their ends. Tolerance as TestFloatKernels.
func TestGemmWide(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2")
	}
	for _, avx2 := range []bool{false, true} {
		if !avx2 && !hasAVX512 {
			continue
		}
		t.Run(fmt.Sprintf("avx2=%v", avx2), func(t *testing.T) {
			forceAVX2 = avx2
			defer func() { forceAVX2 = false }()
			testGemmWide(t)
		})
	}
}

func testGemmWide(t *testing.T) {
	defer func(kc, nc, pkc, pgb int) { wideKC, wideNC, packKC, packGB = kc, nc, pkc, pgb }(wideKC, wideNC, packKC, packGB)
	rng := rand.New(rand.NewPCG(61, 46))
	b := New(2)
	defer b.Close()
	for _, blocks := range [][4]int{{wideKC, wideNC, packKC, packGB}, {64, 8, 64, 2}, {96, 12, 40, 3}} {
		wideKC, wideNC, packKC, packGB = blocks[0], blocks[1], blocks[2], blocks[3]
		for _, s := range []struct{ m, K, N int }{{6, 32, 4}, {7, 136, 9}, {13, 200, 37}, {64, 1027, 30}, {17, 4096, 6}, {1, 64, 8}, {5, 16, 4}, {4, 23, 5}, {8, 8, 3}} {
			x := randn(rng, s.m*s.K)
			wb, w16 := truncBF16(randn(rng, s.N*s.K))
			out := make([]float32, s.m*s.N)
			if !b.gemmWide(out, x, &Weight{rows: s.N, cols: s.K, bf16: wb}, s.m) {
				t.Fatalf("%+v: gemmWide declined", s)
			}
			tol := 1e-5 * float64(s.K)
			name := fmt.Sprintf("%+v blocks %v", s, blocks)
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
