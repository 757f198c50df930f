package builtin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/engine"
)

// TestLoad extracts the built-in model into a fresh user cache folder, loads
// it and generates text from a text prompt.
func TestLoad(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Linux and the BSDs
	t.Setenv("HOME", cache)           // and on macOS
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dir, cache) {
		t.Errorf("extracted to %s, not below the user cache folder %s", dir, cache)
	}
	m, err := Load(engine.Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.Config().ModelType; got != "deepseek_v4" {
		t.Errorf("model_type %q, want deepseek_v4", got)
	}
	// docs/MODEL_CARD.md counts 8,381,825 parameters, as PyTorch does; Info
	// counts the five MoE layers' router biases too (4 each), buffers there.
	if in := m.Info(); in.Parameters != 8_381_825+5*4 || in.Quantization != "NVFP4" {
		t.Errorf("Info: %d parameters, quantization %q", in.Parameters, in.Quantization)
	}
	if again, err := Dir(); err != nil || again != dir || filepath.Dir(dir) != filepath.Join(cache, "manifold") {
		t.Errorf("second Dir: %s, %v; first %s", again, err, dir)
	}
	ids, err := m.Encode("func main() {", false)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.NewSession(64)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	res, err := s.Generate(context.Background(), ids, engine.GenerateOptions{MaxTokens: 16, StopTokens: []int{}},
		func(tok engine.Token) error { text.WriteString(tok.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tokens) != 16 || text.Len() == 0 {
		t.Errorf("%d tokens, text %q", len(res.Tokens), text.String())
	}
}
