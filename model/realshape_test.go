package model

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
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
	root := os.Getenv("MANIFOLD_REALSHAPE_DIR")
	if root == "" {
		t.Skip("MANIFOLD_REALSHAPE_DIR unset: no real-shape folders (model/testdata/gen_moe_fixtures.py --real-shape writes them)")
	}
	tol := 1e-2
	if s := os.Getenv("MANIFOLD_REALSHAPE_TOL"); s != "" {
		var err error
		if tol, err = strconv.ParseFloat(s, 64); err != nil {
			t.Fatalf("MANIFOLD_REALSHAPE_TOL: %v", err)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "golden.safetensors"))
	if _, err := os.Stat(filepath.Join(root, "golden.safetensors")); err == nil {
		dirs = append(dirs, filepath.Join(root, "golden.safetensors"))
	}
	if len(dirs) == 0 {
		t.Fatalf("no */golden.safetensors under %s", root)
	}
	for _, g := range dirs {
		dir := filepath.Dir(g)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			ref := golden.Load(t, dir)
			m := loadTestModel(t, dir)
			T, V := len(ref.InputIDs), ref.Vocab
			st, err := m.NewState(T)
			if err != nil {
				t.Fatal(err)
			}
			got, err := m.Forward(context.Background(), st, ref.InputIDs, true)
			if err != nil {
				t.Fatal(err)
			}
			agree, maxRef := 0, 0.0
			for i := range T {
				row, want := got[i*V:(i+1)*V], ref.LogitsFull[i*V:(i+1)*V]
				if argmax(row) == argmax(want) {
					agree++
				}
				maxRef = max(maxRef, maxAbsDiff(want, make([]float32, V)))
			}
			d := maxAbsDiff(got, ref.LogitsFull)
			t.Logf("%s (%s, %d layers, hidden %d, vocab %d): max |dlogit| %.3g (max |logit| %.3g), top-1 agreement %d/%d",
				dir, m.Config().ModelType, m.Config().NumLayers, m.Config().HiddenSize, V, d, maxRef, agree, T)
			if d > tol || agree != T {
				t.Errorf("max |dlogit| %.3g (tolerance %g), top-1 agreement %d/%d", d, tol, agree, T)
			}
		})
	}
}
