package golden

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/manifoldlm/manifold/layers"
)

// The real-shape checks (model.TestRealShape on the CPU,
// kernels.TestRealShapeOnGPU on the GPU and the CPU) share what follows:
// the folders under MANIFOLD_REALSHAPE_DIR (model/testdata/gen_moe_fixtures.py
// --real-shape, gen_v4_released.py --real-shape write them: random weights
// at the released dimensions, each with transformers' float32 logits_full of
// its input_ids in golden.safetensors), one forward pass over the input, and
// the logits' comparison.

// RealShapeRoot is MANIFOLD_REALSHAPE_DIR, the folder holding the
// real-shape folders (or one of them); without it the test is skipped, the
// message naming writers (what writes the folders).
func RealShapeRoot(t testing.TB, writers string) string {
	t.Helper()
	root := os.Getenv("MANIFOLD_REALSHAPE_DIR")
	if root == "" {
		t.Skip("MANIFOLD_REALSHAPE_DIR unset: no real-shape folders (" + writers + ")")
	}
	return root
}

// RealShapes runs fn as a subtest of t, named by the folder, on each
// real-shape folder under root (root/*/golden.safetensors, and root itself
// where it holds one) with the folder's Reference; t fails where there is
// none.
func RealShapes(t *testing.T, root string, fn func(t *testing.T, dir string, ref *Reference)) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "golden.safetensors"))
	if _, err := os.Stat(filepath.Join(root, "golden.safetensors")); err == nil {
		dirs = append(dirs, filepath.Join(root, "golden.safetensors"))
	}
	if len(dirs) == 0 {
		t.Fatalf("no */golden.safetensors under %s", root)
	}
	for _, g := range dirs {
		dir := filepath.Dir(g)
		t.Run(filepath.Base(dir), func(t *testing.T) { fn(t, dir, Load(t, dir)) })
	}
}

// EnvFloat is the float in the environment variable name, def when unset;
// the test fails where it does not parse (MANIFOLD_REALSHAPE_TOL and the
// like).
func EnvFloat(t testing.TB, name string, def float64) float64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// Forward runs ref's input_ids through m (a model.Model) in one pass from a
// new state and returns every position's logits, or an error where they are
// not T x Vocab.
func Forward[S any](m interface {
	NewState(capacity int) (S, error)
	Forward(ctx context.Context, st S, tokens []int32, all bool) ([]float32, error)
}, ref *Reference) ([]float32, error) {
	st, err := m.NewState(len(ref.InputIDs))
	if err != nil {
		return nil, err
	}
	logits, err := m.Forward(context.Background(), st, ref.InputIDs, true)
	if err != nil {
		return nil, err
	}
	if len(logits) != len(ref.LogitsFull) {
		return nil, fmt.Errorf("%d logits, golden %d (vocab %d)", len(logits), len(ref.LogitsFull), ref.Vocab)
	}
	return logits, nil
}

// Comparison is got against want over rows of Vocab logits.
type Comparison struct {
	Rows  int
	Worst float64 // max |got - want| (+Inf where got holds a NaN)
	Agree int     // rows whose top-1 (first largest logit) is want's
	Ties  int     // rows whose top-1 differs within a near tie: want's top-1 leads got's by at most twice the row's max |got - want|
}

// CompareLogits compares got with want, rows of V logits each.
func CompareLogits(got, want []float32, V int) Comparison {
	c := Comparison{Rows: len(want) / V}
	for i := range c.Rows {
		g, w := got[i*V:(i+1)*V], want[i*V:(i+1)*V]
		d := 0.0
		for j := range g {
			d = max(d, math.Abs(float64(g[j])-float64(w[j])))
			if math.IsNaN(float64(g[j])) {
				d = math.Inf(1)
			}
		}
		c.Worst = max(c.Worst, d)
		gt, wt := layers.Argmax(g), layers.Argmax(w)
		switch {
		case gt == wt:
			c.Agree++
		case float64(w[wt])-float64(w[gt]) <= 2*d:
			c.Ties++
		}
	}
	return c
}

// MaxAbs is max |v| (NaN where v holds one).
func MaxAbs(v []float32) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}
