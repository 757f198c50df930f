// Package builtin loads Manifold's built-in model, so that a program can run
// a model with no download: a small DeepSeek-V4 (8.4M parameters, NVFP4)
// trained on the Go standard library's sources, with its own tokenizer; it
// completes Go code and has no chat template (docs/MODEL_CARD.md describes
// it and its limits). It is embedded in every binary that imports this
// package (8.8 MB) and extracted on first use.
//
//	m, err := builtin.Load(engine.Options{})
//
// The package is separate from engine so that programs that load their own
// model folders do not carry the embedded files.
package builtin

import (
	"fmt"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/defaultmodel"
)

// Dir returns the folder of the built-in model, extracting the embedded
// files on first use below os.UserCacheDir()/manifold (os.TempDir()/manifold
// where the system has no user cache folder) under a name derived from
// their content, and reusing that folder afterwards. It is what
// `go run ./cmd/generate` runs when given no -model.
func Dir() (string, error) {
	dir, err := defaultmodel.Dir()
	if err != nil {
		return "", fmt.Errorf("engine/builtin: extracting the built-in model: %w", err)
	}
	return dir, nil
}

// Load loads the built-in model with opts: engine.Load(Dir(), opts).
func Load(opts engine.Options) (*engine.Model, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	return engine.Load(dir, opts)
}
