package golden

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRealShapes runs RealShapes on a fake MANIFOLD_REALSHAPE_DIR: two
// folders holding a fixture's golden.safetensors, one without, and one at
// the root, which is a folder of its own.
func TestRealShapes(t *testing.T) {
	src := filepath.Join(Dir(t), Models(t)[0], "golden.safetensors")
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, d := range []string{"a", "b", "empty", "."} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if d != "empty" {
			if err := os.WriteFile(filepath.Join(root, d, "golden.safetensors"), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("MANIFOLD_REALSHAPE_DIR", root)
	var seen []string
	RealShapes(t, RealShapeRoot(t, "test"), func(t *testing.T, dir string, ref *Reference) {
		seen = append(seen, filepath.Base(dir))
		if len(ref.LogitsFull) != len(ref.InputIDs)*ref.Vocab || ref.Vocab == 0 {
			t.Errorf("%s: %d logits for %d ids, vocab %d", dir, len(ref.LogitsFull), len(ref.InputIDs), ref.Vocab)
		}
	})
	if want := []string{"a", "b", filepath.Base(root)}; !slices.Equal(seen, want) {
		t.Errorf("folders %q, want %q", seen, want)
	}
}

type fakeModel struct{ logits []float32 }

func (m fakeModel) NewState(int) (int, error) { return 0, nil }
func (m fakeModel) Forward(_ context.Context, _ int, _ []int32, _ bool) ([]float32, error) {
	return m.logits, nil
}

func TestForwardAndCompare(t *testing.T) {
	ref := &Reference{InputIDs: []int32{1, 2}, LogitsFull: []float32{0, 1, 2, 5, 4, 3}, Vocab: 3}
	if _, err := Forward(fakeModel{make([]float32, 5)}, ref); err == nil || err.Error() != "5 logits, golden 6 (vocab 3)" {
		t.Errorf("short logits: %v", err)
	}
	got := []float32{0, 1, 2.25, 4.5, 4.75, 3}
	if l, err := Forward(fakeModel{got}, ref); err != nil || !slices.Equal(l, got) {
		t.Fatalf("Forward: %v, %v", l, err)
	}
	// Row 0 agrees (max diff 0.25); row 1's top-1 differs by 1 <= 2 x 0.75: a near tie.
	if c := CompareLogits(got, ref.LogitsFull, 3); c != (Comparison{Rows: 2, Worst: 0.75, Agree: 1, Ties: 1}) {
		t.Errorf("CompareLogits: %+v", c)
	}
	got[0] = float32(math.NaN())
	if c := CompareLogits(got, ref.LogitsFull, 3); !math.IsInf(c.Worst, 1) {
		t.Errorf("NaN: worst %v", c.Worst)
	}
	if m := MaxAbs([]float32{1, -7, 3}); m != 7 {
		t.Errorf("MaxAbs %v", m)
	}
}
