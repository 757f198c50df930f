package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestGenerateDefaultModel runs the README's first command: no -model, the
// built-in model, extracted into a temporary user cache.
func TestGenerateDefaultModel(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache) // os.UserCacheDir on Unix
	t.Setenv("HOME", cache)           // on macOS
	t.Setenv("LocalAppData", cache)   // on Windows
	var out, errOut bytes.Buffer
	if err := run([]string{"-prompt", "func main() {", "-max-tokens", "16", "-seed", "1", "-device", "cpu"}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	if strings.TrimSpace(out.String()) == "" {
		t.Error("no text generated")
	}
	for _, want := range []string{"loaded", cache, "deepseek_v4", "decode: 16 tokens", "tokens/s"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
	t.Logf("stdout %q\nstderr %q", out.String(), errOut.String())
}
