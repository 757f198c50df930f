package conformance

import (
	"fmt"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
)

// fp8Cases are FP8 E4M3 block-scaled matmuls (128x128 tiles, E8M0 and
// float32 scales) at the token counts that take each of the GPU's FP8
// kernels (kernels/fp8.cuh: m = 1 the decode GEMV, 3 and 16 the small-m
// choices, 64 and 512 the tensor-core GEMM's token tiles) and at widths and
// heights off every tile: N off 128 and the GEMV's row pairs, K off 128 (a
// partial last tile), K below one tile, K % 16 != 0 (widened at upload), K =
// 7168 (DeepSeek-V3's hidden size, split over the GEMM's K).
func fp8Cases() []Case {
	var cs []Case
	for _, f := range []backend.Format{backend.FP8Block, fp8BlockF32} {
		name := "fp8block-e8m0"
		if f == fp8BlockF32 {
			name = "fp8block-f32"
		}
		for _, s := range []struct {
			m, rows, cols int
			bias          bool
		}{
			{1, 7, 64, false}, {1, 257, 2048, true}, {1, 129, 7168, false},
			{3, 130, 320, false}, {3, 33, 200, false},
			{16, 200, 272, true}, {16, 64, 7168, false},
			{64, 130, 400, false}, {64, 256, 1024, true},
			{512, 200, 272, true},
		} {
			shape := fmt.Sprintf("%s/m=%d/%dx%d", name, s.m, s.rows, s.cols)
			if s.bias {
				shape = fmt.Sprintf("%s+bias/m=%d/%dx%d", name, s.m, s.rows, s.cols)
			}
			cs = append(cs, Case{Op: "MatMul", Shape: shape, Tol: 4e-3, Needs: "format:fp8block",
				Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
					return matmul(b, rng, f, s.m, s.rows, s.cols, s.bias)
				}})
		}
	}
	// x at an offset of one value (not 16-byte aligned: the GPU's any-shape
	// FP8 kernel, gemv_fp8_any), m = 1 and 3.
	for _, m := range []int{1, 3} {
		cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("fp8block-e8m0/x-offset=1/m=%d/96x256", m), Tol: 4e-3, Needs: "format:fp8block",
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return matmulAt(b, rng, backend.FP8Block, m, 96, 256, 1)
			}})
	}
	return cs
}

// matmulAt is matmul with x read from a view off values into its buffer.
func matmulAt(b backend.Backend, rng *rand.Rand, f backend.Format, m, rows, cols, off int) ([]float32, []float32) {
	wv, hw := weight(rng, f, rows, cols)
	w := must(b.Upload(hw))
	x := rnd(rng, off+m*cols, 1)
	want := make([]float32, m*rows)
	refMatMul(want, x[off:], wv, nil, m, rows, cols, cols, rows)
	dst := b.NewBuffer(m * rows)
	b.MatMul(dst, b.View(upload(b, x), off, m*cols), w, m)
	return read(b, dst), want
}
