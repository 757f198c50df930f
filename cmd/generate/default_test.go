package main

import (
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
	out, errOut := runOK(t, "-prompt", "func main() {", "-max-tokens", "16", "-seed", "1", "-device", "cpu")
	// stdout is the whole text: the prompt, then what the model wrote.
	const prompt = "func main() {"
	if !strings.HasPrefix(out, prompt) || strings.TrimSpace(strings.TrimPrefix(out, prompt)) == "" {
		t.Errorf("stdout %q: want the prompt, then text", out)
	}
	for _, want := range []string{"loaded", cache, "deepseek_v4", "decode: 16 tokens", "tokens/s"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
	t.Logf("stdout %q\nstderr %q", out, errOut)

	// -stop: the same run cut before the first occurrence of a stop string
	// taken from the middle of its text (the seed fixes the draws), given to
	// the flag with its escapes.
	text := strings.TrimSuffix(strings.TrimPrefix(out, prompt), "\n") // run ends its output with a line break
	r := []rune(text)
	if len(r) < 8 {
		t.Skipf("text %q too short to take a stop string from", text)
	}
	stop := string(r[len(r)/2 : len(r)/2+3])
	cut := strings.Index(text, stop)
	flag := strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\t", `\t`).Replace(stop)
	out, errOut = runOK(t, "-prompt", "func main() {", "-max-tokens", "16", "-seed", "1", "-device", "cpu", "-stop", flag)
	if got := strings.TrimSuffix(out, "\n"); got != prompt+text[:cut] || !strings.Contains(errOut, "(stop string)") {
		t.Errorf("-stop %q: stdout %q, stderr %q; want %q and the stop string as the reason", flag, got, errOut, text[:cut])
	}
}
