package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzChatTemplate renders any template text: a chat template comes from the
// model folder, and whatever it holds must end in text or an error, never in
// a crash of the program embedding the engine (a Go runtime panic recovered as
// an internal error counts as a bug here, as do a stack overflow and memory
// without bound, which no recover catches).
func FuzzChatTemplate(f *testing.F) {
	files, _ := filepath.Glob("testdata/chat/*.jinja")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	var features []string
	b, err := os.ReadFile("testdata/chat/features.json")
	if err != nil {
		f.Fatal(err)
	}
	if err := json.Unmarshal(b, &features); err != nil {
		f.Fatal(err)
	}
	for _, s := range features {
		f.Add(s)
	}
	for _, s := range []string{
		"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
		"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
		"{{ ('x' * 1000)|replace('x', 'yyyyyyyyyyyyyyyy' * 1000) }}",
		"{{ [0] * 100000000 }}",
		"{{ messages|tojson(indent=100000000) }}",
		"{{ " + strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000) + " }}",
		"{{ 1" + strings.Repeat("+1", 5000) + " }}",
	} {
		f.Add(s)
	}
	tk := chatTokenizer(map[string]string{"bos_token": "<s>", "eos_token": "</s>"}, "")
	msgs := []Message{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}
	f.Fuzz(func(t *testing.T, src string) {
		out, err := tk.RenderChatTemplate(src, msgs, true)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("%q: %v", src, err)
			}
			return
		}
		if len(out) > maxOutput {
			t.Fatalf("rendered %d bytes, over the %d limit", len(out), maxOutput)
		}
	})
}
