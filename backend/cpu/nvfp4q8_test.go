package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// TestQ8Scale: every finite E4M3 scale code re-encodes exactly (sign and
// zero split off).
func TestQ8Scale(t *testing.T) {
	for c := range 256 {
		v := quant.E4M3ToFloat32(byte(c))
		if math.IsNaN(float64(v)) {
			continue
		}
		code, neg, zero := q8Scale(byte(c))
		got := q8ScaleValue(code)
		switch {
		case zero:
			got = 0
		case neg:
			got = -got
		}
		if got != v {
			t.Errorf("code %#02x: %v, want %v", c, got, v)
		}
	}
}

// TestQ8MatMul holds the int8-activation NVFP4 kernels (AVX-512 VNNI and
// AVX2, or NEON with and without SDOT, where present, and the portable Go
// kernel) to the float64 product of the dequantized
// weights and the unquantized x. The error is the activations' rounding to
// int8: its RMS over the outputs must stay under 0.5% of the RMS of the
// outputs, the assembly and Go kernels within 1e-5 of that RMS of each other. Shapes are
// off the 128-column group and the 4-row quad; some block scales are
// negated, zeroed or subnormal to take every re-encoding path.
func TestQ8MatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 1))
	for _, s := range [][3]int{{1, 7, 48}, {1, 257, 2048}, {3, 33, 80}, {17, 64, 400}, {5, 10, 4096}, {150, 9, 4096}} {
		m, rows, cols := s[0], s[1], s[2]
		q, x, want, wantSq := nvfp4Case(t, rng, m, rows, cols)
		qw := newQ8Weight(q, serialPar)
		acts := newQ8Act(qw.groups, m)
		for i := range m {
			quantizeQ8(acts[i], x[i*cols:(i+1)*cols], qw.groups)
		}
		for _, forceBase := range q8Paths() {
			q8ForceBase = forceBase
			checkQ8Kernels(t, fmt.Sprint(s, " ", q8BaseName, ":", forceBase), qw, acts, want, wantSq)
		}
		q8ForceBase = false
	}
}

// nvfp4Case is a rows x cols NVFP4 weight q and m x cols activations x for
// the int8 kernels' tests, every 13th block scale from the 3rd negated,
// from the 7th zeroed, from the 11th subnormal (every re-encoding path);
// want is x times q's dequantized weight in float64, wantSq its squared
// sum.
func nvfp4Case(t *testing.T, rng *rand.Rand, m, rows, cols int) (q *quant.NVFP4, x []float32, want []float64, wantSq float64) {
	t.Helper()
	q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	for i := range q.Scales {
		switch i % 13 {
		case 3:
			q.Scales[i] |= 0x80 // negative
		case 7:
			q.Scales[i] = 0
		case 11:
			q.Scales[i] = byte(1 + i%7) // subnormal
		}
	}
	x = randn(rng, m*cols)
	deq := q.Dequantize()
	want = make([]float64, m*rows)
	for i := range m {
		for r := range rows {
			var d float64
			for k := range cols {
				d += float64(x[i*cols+k]) * float64(deq[r*cols+k])
			}
			want[i*rows+r] = d
			wantSq += d * d
		}
	}
	return q, x, want, wantSq
}

// rmsError is the RMS of got - want over that of want (wantSq its squared
// sum).
func rmsError(got []float32, want []float64, wantSq float64) float64 {
	var errSq float64
	for i, g := range got {
		d := float64(g) - want[i]
		errSq += d * d
	}
	return math.Sqrt(errSq / wantSq)
}

// checkNear reports the outputs o of a kernel further than tol from og,
// the portable Go kernel's.
func checkNear(t *testing.T, what string, o, og []float32, tol float64) {
	t.Helper()
	for j := range o {
		if d := math.Abs(float64(o[j] - og[j])); d > tol {
			t.Errorf("%s %d: kernel %v, Go %v", what, j, o[j], og[j])
		}
	}
}

// q8Paths are the values of q8ForceBase that pick distinct kernels here:
// both the AVX-512 VNNI and the AVX2 kernels where the processor has both,
// both the SDOT and the SMULL kernels on arm64 with SDOT.
func q8Paths() []bool {
	if hasVNNI512 || hasSDOT {
		return []bool{false, true}
	}
	return []bool{false}
}

// checkQ8Kernels runs matmulQuads (the kernels q8ForceBase picks) against want
// (their float64 product, squared sum wantSq) and the kernels against the
// portable Go ones.
func checkQ8Kernels(t *testing.T, s string, qw *q8Weight, acts []q8Act, want []float64, wantSq float64) {
	t.Helper()
	m, rows := len(acts), qw.rows
	got := make([]float32, m*rows)
	matmulQuads(got, acts, &qw.quadWeight, 0, (rows+3)/4, &q8Kernels)
	if rel := rmsError(got, want, wantSq); rel > 5e-3 {
		t.Errorf("%v: RMS error %.3g of the output's RMS, want <= 5e-3", s, rel)
	}
	// The Go kernels against the ones MatMul dispatches to (float sums in
	// another order: within 1e-5 of the outputs' RMS).
	rms := math.Sqrt(wantSq / float64(len(want)))
	checkQuadKernels(t, s, &qw.quadWeight, acts, &q8Kernels, &q8GoKernels, 1e-5*rms/float64(qw.mul))
}

// q8GoKernels and q16GoKernels are the layouts' portable kernels.
var (
	q8GoKernels  = quadKernels[q8Act]{row4: row4Q8Go, dot4: dot4Q8Go}
	q16GoKernels = quadKernels[q16Act]{row8: row8Q16Go, row4: row4Q16Go, dot4: dot4Q16Go}
)

// checkQuadKernels holds a layout's kernels k (those MatMul dispatches to)
// to its portable ones kgo on w and the m tokens acts: per quad dot4 with
// the last token, row4 on the quad's row 1 with tokens 0..3 (m >= 4), row8
// on its row 2 with the last 8 (m >= 8, where the layout has one). The
// outputs, before the global scale, must be within tol of each other.
func checkQuadKernels[A any](t *testing.T, name string, w *quadWeight, acts []A, k, kgo *quadKernels[A], tol float64) {
	t.Helper()
	m, G := len(acts), w.groups
	qstrideC, qstrideS := G*4*w.groupB, G*4*w.blocks
	var o, og [4]float32
	var o8, og8 [8]float32
	for quad := range (w.rows + 3) / 4 {
		c := w.codes[quad*qstrideC : (quad+1)*qstrideC]
		sc := w.scales[quad*qstrideS : (quad+1)*qstrideS]
		k.dot4(c, sc, acts[m-1], G, &o)
		kgo.dot4(c, sc, acts[m-1], G, &og)
		checkNear(t, fmt.Sprintf("%v quad %d row", name, quad), o[:], og[:], tol)
		if m >= 4 {
			k.row4(c[w.groupB:], sc[w.blocks:], acts[:4], G, &o)
			kgo.row4(c[w.groupB:], sc[w.blocks:], acts[:4], G, &og)
			checkNear(t, fmt.Sprintf("%v quad %d token", name, quad), o[:], og[:], tol)
		}
		if m >= 8 && k.row8 != nil {
			k.row8(c[2*w.groupB:], sc[2*w.blocks:], acts[m-8:], G, &o8)
			kgo.row8(c[2*w.groupB:], sc[2*w.blocks:], acts[m-8:], G, &og8)
			checkNear(t, fmt.Sprintf("%v quad %d 8-token", name, quad), o8[:], og8[:], tol)
		}
	}
}

// BenchmarkQ8Kernels times the int8 kernels (benchQuadKernels), each path
// the processor has.
func BenchmarkQ8Kernels(b *testing.B) {
	repack := func(q *quant.NVFP4) *quadWeight { return &newQ8Weight(q, serialPar).quadWeight }
	for _, forceBase := range q8Paths() {
		q8ForceBase = forceBase
		benchQuadKernels(b, fmt.Sprintf("/%s=%v", q8BaseName, forceBase), repack, newQ8Act, &q8Kernels)
	}
	q8ForceBase = false
}

// serialPar runs fn over [0, n) in one call (the par of newQ8Weight and
// newQ16Weight).
func serialPar(n int, fn func(lo, hi int)) { fn(0, n) }

// benchQuadKernels times a layout's kernels k on a 64 x 2048 weight held in
// cache (their compute rate, not memory's), repacked by repack, its tokens'
// activations made by newActs: dot (dot4, decode: one token), row (row4,
// prefill: 4 tokens) and, where the layout has one, row8 (8 tokens, twice
// row's products). The sub-benchmarks are named kernel+suffix.
func benchQuadKernels[A any](b *testing.B, suffix string, repack func(*quant.NVFP4) *quadWeight, newActs func(groups, m int) []A, k *quadKernels[A]) {
	const rows, cols = 64, 2048
	rng := rand.New(rand.NewPCG(61, 5))
	q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
	if err != nil {
		b.Fatal(err)
	}
	w := repack(q)
	G := w.groups
	kernels := []string{"dot", "row"}
	if k.row8 != nil {
		kernels = append(kernels, "row8")
	}
	acts := newActs(G, 4*(len(kernels)-1))
	for i := range acts {
		k.quantize(acts[i], randn(rng, cols), G)
	}
	for _, kernel := range kernels {
		b.Run(kernel+suffix, func(b *testing.B) {
			var o [4]float32
			var o8 [8]float32
			for b.Loop() {
				for quad := range rows / 4 {
					c, sc := w.codes[quad*G*4*w.groupB:], w.scales[quad*G*4*w.blocks:]
					switch kernel {
					case "dot":
						k.dot4(c, sc, acts[0], G, &o)
					case "row":
						k.row4(c, sc, acts[:4], G, &o)
					default:
						k.row8(c, sc, acts, G, &o8)
					}
				}
			}
			b.SetBytes(rows * cols / 2)
		})
	}
}

// TestQuantizeParts: a token's activations quantized in parts of groups
// (matmulRepacked's first phase splits one token so) equal the whole
// row's quantization bit for bit, in both layouts, on lengths off the
// group size.
func TestQuantizeParts(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 24))
	for _, K := range []int{1040, 2048, 4144, 8192} {
		x := randn(rng, K)
		for _, step := range []int{1, 3, 4} {
			g8 := (K + q8Group - 1) / q8Group
			whole8, parts8 := newQ8Act(g8, 1)[0], newQ8Act(g8, 1)[0]
			quantizeQ8(whole8, x, g8)
			for g0 := 0; g0 < g8; g0 += step {
				g1 := min(g0+step, g8)
				quantizeQ8(partQ8(parts8, g0, g1), x[min(K, g0*q8Group):min(K, g1*q8Group)], g1-g0)
			}
			if !slices.Equal(whole8.q, parts8.q) || !slices.Equal(whole8.sc, parts8.sc) || !slices.Equal(whole8.sum, parts8.sum) ||
				!slices.Equal(whole8.x5, parts8.x5) || !slices.Equal(whole8.c5, parts8.c5) {
				t.Errorf("q8, K %d, parts of %d groups: not the whole row's quantization", K, step)
			}
			g16 := (K + q16Group - 1) / q16Group
			whole16, parts16 := newQ16Act(g16, 1)[0], newQ16Act(g16, 1)[0]
			quantizeQ16(whole16, x, g16)
			for g0 := 0; g0 < g16; g0 += step {
				g1 := min(g0+step, g16)
				quantizeQ16(partQ16(parts16, g0, g1), x[min(K, g0*q16Group):min(K, g1*q16Group)], g1-g0)
			}
			if !slices.Equal(whole16.x, parts16.x) || !slices.Equal(whole16.sc, parts16.sc) || !slices.Equal(whole16.c, parts16.c) {
				t.Errorf("q16, K %d, parts of %d groups: not the whole row's quantization", K, step)
			}
		}
	}
}

// TestMatMulThreads: an NVFP4 matmul's outputs do not depend on the
// threads (the quantization split or not, the rows' sums as on one), for
// decode and a few tokens.
func TestMatMulThreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 25))
	for _, s := range [][3]int{{1, 300, 8192}, {1, 64, 2048}, {1, 40, 1040}, {5, 70, 2048}} {
		m, rows, cols := s[0], s[1], s[2]
		q, err := quant.QuantizeNVFP4(randn(rng, rows*cols), rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		x := Buffer(randn(rng, m*cols))
		var want []float32
		for _, threads := range []int{1, 2, 3, 16} {
			b := New(threads)
			w, err := b.Upload(&backend.HostWeight{Name: "w", Rows: rows, Cols: cols, Format: backend.NVFP4, Q: q})
			if err != nil {
				t.Fatal(err)
			}
			out := make(Buffer, m*rows)
			b.MatMul(out, x, w, m)
			if want == nil {
				want = out
			} else if !slices.Equal(out, want) {
				t.Errorf("%v, %d threads: outputs differ from one thread's", s, threads)
			}
			b.Close()
		}
	}
}
