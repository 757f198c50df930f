// Package modeltest holds what tests and benchmarks outside the engine do
// alike with a model folder: write a random checkpoint (a spec of
// internal/testmodel) to a temporary folder, load a folder through the
// engine and open a session. Only tests import it.
package modeltest

import (
	"testing"

	"github.com/manifoldlm/manifold/engine"
)

// Writer is a checkpoint spec that writes itself to a folder, as
// testmodel.Llama, testmodel.DeepseekV4 and testmodel.Spec do.
type Writer interface {
	Write(dir string) error
}

// Write writes w to a new temporary folder of tb and returns the folder,
// failing tb on an error.
func Write(tb testing.TB, w Writer) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := w.Write(dir); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// Open loads the model in dir with o and opens a session of the model's
// context length, failing tb on an error; the model is closed when tb ends.
func Open(tb testing.TB, dir string, o engine.Options) (*engine.Model, *engine.Session) {
	tb.Helper()
	m, err := engine.Load(dir, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	s, err := m.NewSession(0)
	if err != nil {
		tb.Fatal(err)
	}
	return m, s
}
