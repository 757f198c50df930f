// Package golden finds and reads the reference fixtures (see the fixture set's
// README): tests locate them through MANIFOLD_GOLDEN_DIR, by default
// ../shared/golden from the module root. It is for tests only and never
// writes the fixtures.
package golden

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/manifoldlm/manifold/weights"
)

// Dir returns the fixture directory, skipping the test when it is absent.
// The skip says what was not checked; the first skip of a test binary also
// writes one summary line to stderr, which `go test -v` and the output of a
// failing package show (a passing package's output is hidden by `go test
// ./...`: .ci/run therefore refuses to run without the fixtures).
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := find()
	if err != nil {
		missingOnce.Do(func() { fmt.Fprintln(summary, missingSummary(dir, err)) })
		t.Skip(skipMessage(dir, err))
	}
	return dir
}

// Path joins elem to the fixture directory (a model's folder: Path(t,
// "llama")), skipping the test as Dir does when the fixtures are absent.
func Path(t testing.TB, elem ...string) string {
	t.Helper()
	return filepath.Join(append([]string{Dir(t)}, elem...)...)
}

// find locates the fixture directory: MANIFOLD_GOLDEN_DIR (relative to the
// module root when relative), else ../shared/golden from the module root.
// The error says why it is not there; dir is where it was looked for.
func find() (dir string, err error) {
	dir = os.Getenv("MANIFOLD_GOLDEN_DIR")
	if dir == "" {
		root, err := moduleRoot()
		if err != nil {
			return "../shared/golden", fmt.Errorf("no go.mod above the working directory: %w", err)
		}
		dir = filepath.Join(root, "..", "shared", "golden")
	} else if !filepath.IsAbs(dir) {
		// Relative paths are relative to the module root, where `go test ./...` is run.
		if root, err := moduleRoot(); err == nil {
			dir = filepath.Join(root, dir)
		}
	}
	if fi, err := os.Stat(dir); err != nil {
		return dir, err
	} else if !fi.IsDir() {
		return dir, fmt.Errorf("%s is not a folder", dir)
	}
	return dir, nil
}

var (
	missingOnce sync.Once
	summary     io.Writer = os.Stderr // tests replace it
)

func skipMessage(dir string, err error) string {
	return fmt.Sprintf("SKIPPED, nothing checked: this test compares with the golden fixtures (HuggingFace transformers' outputs), not found at %s (%v); set MANIFOLD_GOLDEN_DIR", dir, err)
}

func missingSummary(dir string, err error) string {
	return fmt.Sprintf("golden: FIXTURES MISSING at %s (%v): every test of this package that compares with transformers' outputs is SKIPPED; set MANIFOLD_GOLDEN_DIR (.ci/run fails without them)", dir, err)
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

// tensor is the tensor name of ck, failing the test when it is missing.
func tensor(t testing.TB, ck *weights.Checkpoint, name string) *weights.Tensor {
	t.Helper()
	tn, err := ck.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	return tn
}

// Int32s reads the integer tensor name of ck as int32, failing the test on error.
func Int32s(t testing.TB, ck *weights.Checkpoint, name string) []int32 {
	t.Helper()
	v, err := tensor(t, ck, name).Int64s()
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
	tn := tensor(t, ck, name)
	v, err := tn.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return v, tn.Shape
}
