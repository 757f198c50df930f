package model

import (
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
)

// TestRealShape compares the CPU path with transformers at the released
// dimensions: the folders testdata/gen_moe_fixtures.py --real-shape writes
// (two layers of DeepSeek-V3 in FP8, two of Qwen3-30B-A3B in bf16) and
// testdata/gen_v4_released.py --real-shape writes (two layers of
// DeepSeek-V4-Flash in its released FP8 + MXFP4 layout), random weights,
// each with golden.safetensors holding transformers' float32 logits_full of
// its input_ids. kernels.TestRealShapeOnGPU runs the same folders on the GPU
// and the CPU (dev/realshape/run.sh runs it on the device). MANIFOLD_REALSHAPE_DIR names the folder
// holding them (or one of them); the test is skipped without it. It reports
// max |dlogit| and top-1 agreement per model and fails when a position's
// top-1 differs or max |dlogit| exceeds MANIFOLD_REALSHAPE_TOL (default
// 1e-2: transformers may run on a GPU, whose float32 sums are ordered
// differently).
func TestRealShape(t *testing.T) {
	root := golden.RealShapeRoot(t, "model/testdata/gen_moe_fixtures.py --real-shape writes them")
	tol := golden.EnvFloat(t, "MANIFOLD_REALSHAPE_TOL", 1e-2)
	golden.RealShapes(t, root, func(t *testing.T, dir string, ref *golden.Reference) {
		m := loadTestModel(t, dir)
		got, err := golden.Forward(m, ref)
		if err != nil {
			t.Fatal(err)
		}
		// Top-1 must agree everywhere (no near ties allowed on the CPU), and
		// max |dlogit| is testnum's (a NaN in it fails only through top-1).
		T, V, agree := len(ref.InputIDs), ref.Vocab, golden.CompareLogits(got, ref.LogitsFull, ref.Vocab).Agree
		d := maxAbsDiff(got, ref.LogitsFull)
		t.Logf("%s (%s, %d layers, hidden %d, vocab %d): max |dlogit| %.3g (max |logit| %.3g), top-1 agreement %d/%d",
			dir, m.Config().ModelType, m.Config().NumLayers, m.Config().HiddenSize, V, d, golden.MaxAbs(ref.LogitsFull), agree, T)
		if d > tol || agree != T {
			t.Errorf("max |dlogit| %.3g (tolerance %g), top-1 agreement %d/%d", d, tol, agree, T)
		}
	})
}
