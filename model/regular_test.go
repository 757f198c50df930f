package model

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// TestFolderFilesNotRegular: a named pipe in place of config.json,
// generation_config.json or hf_quant_config.json is refused with an error
// naming it instead of blocking the loader.
func TestFolderFilesNotRegular(t *testing.T) {
	for _, name := range []string{"config.json", "generation_config.json", "hf_quant_config.json"} {
		t.Run(name, func(t *testing.T) {
			spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 1}
			dir := testmodel.WriteTemp(t, spec)
			os.Remove(filepath.Join(dir, name))
			if err := syscall.Mkfifo(filepath.Join(dir, name), 0o644); err != nil {
				t.Skip(err)
			}
			done := make(chan error, 1)
			go func() { _, err := ReadFolder(dir); done <- err }()
			select {
			case err := <-done:
				if !errors.Is(err, weights.ErrNotRegular) {
					t.Errorf("ReadFolder = %v, want ErrNotRegular", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ReadFolder blocked on a named pipe")
			}
		})
	}
}
