package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/quant"
)

// TestQ16MatMul holds the block-per-lane NVFP4 kernels (AVX-512 VNNI where
// present, and the portable Go ones) to the float64 product of the
// dequantized weights and the unquantized x, and to the 128-element
// layout's Go kernels (the same int8 values and scales: equal up to the
// order of the float sums). Shapes are off the 256-column supergroup and
// the 4-row quad; some block scales are negated, zeroed or subnormal.
func TestQ16MatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 16))
	for _, s := range [][3]int{{1, 7, 48}, {1, 257, 2048}, {3, 33, 80}, {17, 64, 400}, {5, 10, 4096}, {150, 9, 4096}, {4, 5, 272}} {
		m, rows, cols := s[0], s[1], s[2]
		q, x, want, wantSq := nvfp4Case(t, rng, m, rows, cols)
		rms := math.Sqrt(wantSq / float64(len(want)))
		name := fmt.Sprint(s)

		qw := newQ16Weight(q, func(n int, fn func(lo, hi int)) { fn(0, n) })
		acts := newQ16Act(qw.groups, m)
		for i := range m {
			quantizeQ16(acts[i], x[i*cols:(i+1)*cols], qw.groups)
		}
		got := make([]float32, m*rows)
		matmulQuads(got, acts, &qw.quadWeight, 0, (rows+3)/4, &q16Kernels)
		// The int8 rounding of x (as TestQ8MatMul's; over as few as 20
		// outputs it has measured up to 6.2e-3 here): within the conformance
		// table's bound for the int8 NVFP4 matmuls.
		if rel := rmsError(got, want, wantSq); rel > 1e-2 {
			t.Errorf("%v: RMS error %.3g of the output's RMS, want <= 1e-2", name, rel)
		}

		// The 128-element layout's Go kernel on the same int8 values.
		q8w := newQ8Weight(q, func(n int, fn func(lo, hi int)) { fn(0, n) })
		a8 := newQ8Act(q8w.groups, m)
		for i := range m {
			quantizeQ8(a8[i], x[i*cols:(i+1)*cols], q8w.groups)
		}
		G8 := q8w.groups
		for i := range m {
			for r := range rows {
				quad, j := r/4, r%4
				ref := rowQ8Go(q8w.codes[quad*G8*4*q8GroupB+j*q8GroupB:], q8w.scales[quad*G8*4*q8Blocks+j*q8Blocks:], a8[i], G8) * q8w.mul
				if d := math.Abs(float64(got[i*rows+r] - ref)); d > 1e-5*rms {
					t.Errorf("%v token %d row %d: %v, 128-element Go kernel %v", name, i, r, got[i*rows+r], ref)
				}
			}
		}

		// The kernels MatMul dispatches to against the portable ones.
		G := qw.groups
		var o, og [4]float32
		var o8, og8 [8]float32
		tol := 1e-5 * rms / float64(qw.mul)
		for quad := range (rows + 3) / 4 {
			c := qw.codes[quad*G*4*q16GroupB : (quad+1)*G*4*q16GroupB]
			sc := qw.scales[quad*G*4*q16Blocks : (quad+1)*G*4*q16Blocks]
			dot4Q16(c, sc, acts[m-1], G, &o)
			dot4Q16Go(c, sc, acts[m-1], G, &og)
			checkNear(t, fmt.Sprintf("%v quad %d row", name, quad), o[:], og[:], tol)
			if m >= 4 {
				row4Q16(c[q16GroupB:], sc[q16Blocks:], acts[:4], G, &o)
				row4Q16Go(c[q16GroupB:], sc[q16Blocks:], acts[:4], G, &og)
				checkNear(t, fmt.Sprintf("%v quad %d token", name, quad), o[:], og[:], tol)
			}
			if m >= 8 {
				row8Q16(c[2*q16GroupB:], sc[2*q16Blocks:], acts[m-8:], G, &o8)
				row8Q16Go(c[2*q16GroupB:], sc[2*q16Blocks:], acts[m-8:], G, &og8)
				checkNear(t, fmt.Sprintf("%v quad %d 8-token", name, quad), o8[:], og8[:], tol)
			}
		}
	}
}

// BenchmarkQ16Kernels times the block-per-lane kernels on a 64 x 2048
// weight held in cache, as BenchmarkQ8Kernels does the 128-element ones
// (row8: twice row's products, 8 tokens instead of 4).
func BenchmarkQ16Kernels(b *testing.B) {
	const rows, cols = 64, 2048
	rng := rand.New(rand.NewPCG(61, 5))
	q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
	if err != nil {
		b.Fatal(err)
	}
	qw := newQ16Weight(q, func(n int, fn func(lo, hi int)) { fn(0, n) })
	G := qw.groups
	acts := newQ16Act(qw.groups, 8)
	for i := range acts {
		quantizeQ16(acts[i], randn(rng, cols), qw.groups)
	}
	for _, kernel := range []string{"dot", "row", "row8"} {
		b.Run(kernel, func(b *testing.B) {
			var o [4]float32
			var o8 [8]float32
			for b.Loop() {
				for quad := range rows / 4 {
					c, sc := qw.codes[quad*G*4*q16GroupB:], qw.scales[quad*G*4*q16Blocks:]
					switch kernel {
					case "dot":
						dot4Q16(c, sc, acts[0], G, &o)
					case "row":
						row4Q16(c, sc, acts[:4], G, &o)
					default:
						row8Q16(c, sc, acts, G, &o8)
					}
				}
			}
			b.SetBytes(rows * cols / 2)
		})
	}
}
