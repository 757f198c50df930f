package conformance

import (
	"fmt"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// bf16JoinCases are bf16 matmuls of one x queued back to back, as a
// layer's q, k and v projections, its gate and up projections followed by
// the SwiGLU, and an output projection followed by the residual add: on the
// CUDA backend (m <= 4, K % 8 == 0) the queue joins them into one launch of
// gemv_bf16_grp (two or three weights; with the residual as its epilogue)
// or gemv_bf16_glu (gate and up with the SwiGLU as its epilogue), at
// feature counts off its 8-row blocks and K off every unroll. Each output
// is compared with the float64 sums, at the 16-bit activations' tolerance.
func bf16JoinCases() []Case {
	cs := rows([]bf16JoinRow{{1, 200, []int{130, 33, 33}}, {1, 4096, []int{96, 24}}, {3, 328, []int{77, 77, 21}}}, bf16JoinCase)
	cs = append(cs, rows([]bf16GLURow{{1, 136, 200, 0}, {1, 300, 4096, 7}, {2, 37, 520, 0}}, bf16GLUCase)...)
	return append(cs, rows([]bf16ResidualRow{{1, 200, 264}, {2, 64, 4096}}, bf16ResidualCase)...)
}

// bf16JoinRow is m tokens of width cols through one matmul per entry of
// rows (its feature count), all of the same x.
type bf16JoinRow struct {
	m, cols int
	rows    []int
}

func bf16JoinCase(s bf16JoinRow) Case {
	return Case{Op: "MatMul", Shape: fmt.Sprintf("bf16-joined/m=%d/K=%d/N=%v", s.m, s.cols, s.rows), Tol: 4e-3,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			x := rnd(rng, s.m*s.cols, 1)
			var got, want []float32
			var ws []backend.Weight
			var outs []backend.Buffer
			for _, rows := range s.rows { // every upload first: the matmuls go back to back
				wv, hw := weight(rng, backend.BF16, rows, s.cols)
				w := must(b.Upload(hw))
				y := make([]float32, s.m*rows)
				refMatMul(y, x, wv, nil, s.m, rows, s.cols, s.cols, rows)
				want = append(want, y...)
				ws, outs = append(ws, w), append(outs, b.NewBuffer(s.m*rows))
			}
			xb := upload(b, x)
			for i, w := range ws {
				b.MatMul(outs[i], xb, w, s.m)
			}
			for _, o := range outs {
				got = append(got, read(b, o)...)
			}
			return got, want
		}}
}

// bf16GLURow is m tokens through rows x cols gate and up projections and
// the SwiGLU at limit.
type bf16GLURow struct {
	m, rows, cols int
	limit         float32
}

func bf16GLUCase(s bf16GLURow) Case {
	return Case{Op: "MatMul,MatMul,SwiGLU", Shape: fmt.Sprintf("bf16-glu/m=%d/%dx%d/limit=%g", s.m, s.rows, s.cols, s.limit), Tol: 4e-3,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			gv, gw := weight(rng, backend.BF16, s.rows, s.cols)
			uv, uw := weight(rng, backend.BF16, s.rows, s.cols)
			x := rnd(rng, s.m*s.cols, 1)
			g, u, want := make([]float32, s.m*s.rows), make([]float32, s.m*s.rows), make([]float32, s.m*s.rows)
			refMatMul(g, x, gv, nil, s.m, s.rows, s.cols, s.cols, s.rows)
			refMatMul(u, x, uv, nil, s.m, s.rows, s.cols, s.cols, s.rows)
			layers.SwiGLU(want, g, u, s.limit)
			wg, wu := must(b.Upload(gw)), must(b.Upload(uw))
			xb, gb, ub := upload(b, x), b.NewBuffer(len(g)), b.NewBuffer(len(u))
			b.MatMul(gb, xb, wg, s.m)
			b.MatMul(ub, xb, wu, s.m)
			b.SwiGLU(gb, gb, ub, s.limit)
			return read(b, gb), want
		}}
}

// bf16ResidualRow is m tokens through a rows x cols matmul whose output is
// added to a residual.
type bf16ResidualRow struct{ m, rows, cols int }

func bf16ResidualCase(s bf16ResidualRow) Case {
	m, rows, cols := s.m, s.rows, s.cols
	return Case{Op: "MatMul,Add", Shape: fmt.Sprintf("bf16-residual/m=%d/%dx%d", m, rows, cols), Tol: 4e-3,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			wv, hw := weight(rng, backend.BF16, rows, cols)
			w := must(b.Upload(hw))
			x, res := rnd(rng, m*cols, 1), rnd(rng, m*rows, 1)
			want := make([]float32, m*rows)
			refMatMul(want, x, wv, nil, m, rows, cols, cols, rows)
			for i := range want {
				want[i] += res[i]
			}
			y, rb := b.NewBuffer(m*rows), upload(b, res)
			b.MatMul(y, upload(b, x), w, m)
			b.Add(rb, rb, y)
			return read(b, rb), want
		}}
}
