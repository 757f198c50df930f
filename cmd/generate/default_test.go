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
	// stdout is the whole text: the prompt, then what the model wrote.
	const prompt = "func main() {"
	if !strings.HasPrefix(out.String(), prompt) || strings.TrimSpace(strings.TrimPrefix(out.String(), prompt)) == "" {
		t.Errorf("stdout %q: want the prompt, then text", out.String())
	}
	for _, want := range []string{"loaded", cache, "deepseek_v4", "decode: 16 tokens", "tokens/s"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
	t.Logf("stdout %q\nstderr %q", out.String(), errOut.String())

	// -stop: the same run cut before the first occurrence of a stop string
	// taken from the middle of its text (the seed fixes the draws), given to
	// the flag with its escapes.
	text := strings.TrimSuffix(strings.TrimPrefix(out.String(), prompt), "\n") // run ends its output with a line break
	r := []rune(text)
	if len(r) < 8 {
		t.Skipf("text %q too short to take a stop string from", text)
	}
	stop := string(r[len(r)/2 : len(r)/2+3])
	cut := strings.Index(text, stop)
	flag := strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\t", `\t`).Replace(stop)
	out.Reset()
	errOut.Reset()
	if err := run([]string{"-prompt", "func main() {", "-max-tokens", "16", "-seed", "1", "-device", "cpu", "-stop", flag}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	if got := strings.TrimSuffix(out.String(), "\n"); got != prompt+text[:cut] || !strings.Contains(errOut.String(), "(stop string)") {
		t.Errorf("-stop %q: stdout %q, stderr %q; want %q and the stop string as the reason", flag, got, errOut.String(), text[:cut])
	}
}
