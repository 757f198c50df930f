// Package modeltest holds what tests and benchmarks outside the engine do
// alike with a model folder (often one testmodel.WriteTemp wrote): load it
// through the engine and open a session. Only tests import it.
package modeltest

import (
	"testing"

	"github.com/manifoldlm/manifold/engine"
)

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
