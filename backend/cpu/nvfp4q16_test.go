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
	for _, s := range [][3]int{{1, 7, 48}, {1, 257, 2048}, {3, 33, 80}, {17, 64, 400}, {5, 10, 4096}, {150, 9, 4096}, {4, 5, 272}, {17, 45, 8448}, {8, 3, 4352}} {
		m, rows, cols := s[0], s[1], s[2]
		q, x, want, wantSq := nvfp4Case(t, rng, m, rows, cols)
		rms := math.Sqrt(wantSq / float64(len(want)))
		name := fmt.Sprint(s)

		qw := newQ16Weight(q, serialPar)
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
		q8w := newQ8Weight(q, serialPar)
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

		// The single-call kernels (tile8, dots) against the per-row ones
		// they replace: the same results, bit for bit.
		perRow := q16Kernels
		perRow.tile8, perRow.dots = nil, nil
		ref := make([]float32, m*rows)
		matmulQuads(ref, acts, &qw.quadWeight, 0, (rows+3)/4, &perRow)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("%v output %d: %v, per-row kernels %v", name, i, got[i], ref[i])
			}
		}

		// The kernels MatMul dispatches to against the portable ones.
		checkQuadKernels(t, name, &qw.quadWeight, acts, &q16Kernels, &q16GoKernels, 1e-5*rms/float64(qw.mul))
	}
}

// BenchmarkQ16Kernels times the block-per-lane kernels as
// BenchmarkQ8Kernels does the 128-element ones.
func BenchmarkQ16Kernels(b *testing.B) {
	repack := func(q *quant.NVFP4) *quadWeight { return &newQ16Weight(q, serialPar).quadWeight }
	benchQuadKernels(b, "", repack, newQ16Act, &q16Kernels)
}

// TestQ16MatMulAllocs: the tiled matmul allocates nothing where the
// processor has the single-call kernels (prefill of 64 tokens, decode of
// one), the per-row kernels' outputs included.
func TestQ16MatMulAllocs(t *testing.T) {
	if !hasVNNI512 {
		t.Skip("no AVX-512 VNNI")
	}
	rng := rand.New(rand.NewPCG(61, 17))
	const rows, cols = 64, 4352 // 17 supergroups: tile8Q16 in chunks
	q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	qw := newQ16Weight(q, serialPar)
	for _, m := range []int{1, 64} {
		acts := newQ16Act(qw.groups, m)
		for i := range acts {
			quantizeQ16(acts[i], randn(rng, cols), qw.groups)
		}
		out := make([]float32, m*rows)
		if n := testing.AllocsPerRun(10, func() { matmulQuads(out, acts, &qw.quadWeight, 0, rows/4, &q16Kernels) }); n != 0 {
			t.Errorf("m=%d: %v allocations a call, want 0", m, n)
		}
	}
}

// BenchmarkQ16Tiles times matmulQuads in cache (512 x 2048, one token and
// 64) with the single-call kernels (tiled) and with the per-row ones they
// replace (rows), in GFLOP per CPU-second.
func BenchmarkQ16Tiles(b *testing.B) {
	rng := rand.New(rand.NewPCG(61, 18))
	const rows, cols = 512, 2048
	q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
	if err != nil {
		b.Fatal(err)
	}
	qw := newQ16Weight(q, serialPar)
	perRow := q16Kernels
	perRow.tile8, perRow.dots = nil, nil
	for _, m := range []int{1, 64} {
		acts := newQ16Act(qw.groups, m)
		for i := range acts {
			quantizeQ16(acts[i], randn(rng, cols), qw.groups)
		}
		out := make([]float32, m*rows)
		for _, k := range []struct {
			name string
			k    *quadKernels[q16Act]
		}{{"tiled", &q16Kernels}, {"rows", &perRow}} {
			b.Run(fmt.Sprintf("m=%d/%s", m, k.name), func(b *testing.B) {
				c0 := processCPU()
				for b.Loop() {
					matmulQuads(out, acts, &qw.quadWeight, 0, rows/4, k.k)
				}
				if c := processCPU() - c0; c > 0 {
					b.ReportMetric(2*rows*cols*float64(m)*float64(b.N)/c/1e9, "GFLOP/cpu-s")
				}
			})
		}
	}
}

// TestQuantizeQ16 holds quantizeQ16 (its whole blocks in assembly where
// quantizeQ16Fast has it) to the portable block quantizer, bit for bit:
// lengths off the block and the supergroup, zero blocks, halves, tiny and
// huge values.
func TestQuantizeQ16(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 19))
	for _, n := range []int{1, 15, 16, 17, 255, 256, 300, 2048, 4100} {
		x := randn(rng, n)
		for i := range x {
			switch rng.IntN(8) {
			case 0:
				x[i] = float32(rng.IntN(255)-127) / 2 // halves after scaling when amax is 127
			case 1:
				x[i] *= 1e-30
			case 2:
				x[i] *= 1e30
			}
		}
		if n > 40 {
			clear(x[16:32]) // a zero block
			x[35] = 127
		}
		groups := (n + q16Group - 1) / q16Group
		got, want := newQ16Act(groups, 1)[0], newQ16Act(groups, 1)[0]
		for i := range got.x {
			got.x[i], want.x[i] = 99, 99 // every code must be written
		}
		quantizeQ16(got, x, groups)
		for blk := range groups * q16Blocks {
			var q [quant.NVFP4BlockSize]int8
			s, sum := q8QuantizeBlock(q[:], x, blk*quant.NVFP4BlockSize)
			g, l := blk/q16Blocks, blk%q16Blocks
			for e, c := range q {
				want.x[g*q16Group+4*l+64*(e>>2)+e&3] = c
			}
			want.sc[blk], want.c[blk] = s, -12*sum
		}
		for i := range want.x {
			if got.x[i] != want.x[i] {
				t.Fatalf("n=%d: code %d = %d, want %d", n, i, got.x[i], want.x[i])
			}
		}
		for i := range want.sc {
			if math.Float32bits(got.sc[i]) != math.Float32bits(want.sc[i]) || got.c[i] != want.c[i] {
				t.Fatalf("n=%d block %d: scale %v sum %d, want %v %d", n, i, got.sc[i], got.c[i], want.sc[i], want.c[i])
			}
		}
	}
}
