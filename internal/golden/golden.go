// Package golden finds and reads the reference fixtures (see the fixture set's
// README): tests locate them through MANIFOLD_GOLDEN_DIR, by default
// ../shared/golden from the module root. It is for tests only and never
// writes the fixtures.
package golden

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/weights"
)

// Dir returns the fixture directory, skipping the test when it is absent.
func Dir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("MANIFOLD_GOLDEN_DIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Skipf("golden fixtures: %v", err)
		}
		dir = filepath.Join(root, "..", "shared", "golden")
	} else if !filepath.IsAbs(dir) {
		// Relative paths are relative to the module root, where `go test ./...` is run.
		if root, err := moduleRoot(); err == nil {
			dir = filepath.Join(root, dir)
		}
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("golden fixtures not found at %s (set MANIFOLD_GOLDEN_DIR)", dir)
	}
	return dir
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", os.ErrNotExist
		}
		dir = parent
	}
}

// Models lists the model fixture folders (those holding a config.json).
func Models(t testing.TB) []string {
	t.Helper()
	dir := Dir(t)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "config.json")); e.IsDir() && err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// Reference is one golden.safetensors: the token sequence and the expected outputs.
type Reference struct {
	InputIDs          []int32
	LogitsFull        []float32 // [T, V]
	LogitsIncremental []float32 // [rows, V], nil when absent
	IncrementalRows   int
	GreedyTokens      []int32 // nil when absent
	Vocab             int
}

// Load reads dir/golden.safetensors.
func Load(t testing.TB, dir string) *Reference {
	t.Helper()
	ck, err := weights.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ints := func(name string) []int32 {
		if !ck.Has(name) {
			return nil
		}
		return Int32s(t, ck, name)
	}
	floats := func(name string) ([]float32, []int) {
		if !ck.Has(name) {
			return nil, nil
		}
		return Float32s(t, ck, name)
	}
	r := &Reference{InputIDs: ints("input_ids"), GreedyTokens: ints("greedy_tokens")}
	var shape []int
	r.LogitsFull, shape = floats("logits_full")
	if len(shape) != 2 || shape[0] != len(r.InputIDs) {
		t.Fatalf("%s: logits_full has shape %v for %d input ids", dir, shape, len(r.InputIDs))
	}
	r.Vocab = shape[1]
	r.LogitsIncremental, shape = floats("logits_incremental")
	if r.LogitsIncremental != nil {
		r.IncrementalRows = shape[0]
	}
	return r
}

// Int32s reads the integer tensor name of ck as int32, failing the test on error.
func Int32s(t testing.TB, ck *weights.Checkpoint, name string) []int32 {
	t.Helper()
	tn, err := ck.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tn.Int64s()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// Float32s reads the float tensor name of ck and its shape, failing the test on error.
func Float32s(t testing.TB, ck *weights.Checkpoint, name string) ([]float32, []int) {
	t.Helper()
	tn, err := ck.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tn.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return v, tn.Shape
}
