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
// without bound, which no recover catches): checkChatTemplate.
//
// It takes templates of up to maxFuzzTemplate bytes. The fuzzer minimizes
// every input that finds new coverage, at a cost that grows with the square
// of its length: with the 4 KB templates of testdata/chat and 10 KB nesting
// probes among the seeds it spent most of its minute minimizing. The seeds
// are testdata/chat/features.json's constructs and the short templates;
// TestChatTemplateLimits renders the long ones (real templates and the
// probes of the evaluator's limits) under the same rule.
func FuzzChatTemplate(f *testing.F) {
	for _, src := range chatTemplateInputs(f) {
		if len(src) <= maxFuzzTemplate {
			f.Add(src)
		}
	}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > maxFuzzTemplate {
			return
		}
		checkChatTemplate(t, src)
	})
}

// maxFuzzTemplate bounds FuzzChatTemplate's inputs.
const maxFuzzTemplate = 512

// TestChatTemplateLimits renders FuzzChatTemplate's inputs that are too long
// for it: the real templates of testdata/chat and the probes of the
// evaluator's limits (recursion, nesting, output size).
func TestChatTemplateLimits(t *testing.T) {
	n := 0
	for _, src := range chatTemplateInputs(t) {
		if len(src) > maxFuzzTemplate {
			checkChatTemplate(t, src)
			n++
		}
	}
	if n == 0 {
		t.Fatal("no input longer than FuzzChatTemplate takes")
	}
}

// chatTemplateInputs are the templates of testdata/chat, the constructs of
// features.json, and probes of the evaluator's limits.
func chatTemplateInputs(t testing.TB) []string {
	var inputs []string
	files, _ := filepath.Glob("testdata/chat/*.jinja")
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, string(b))
	}
	var features []string
	b, err := os.ReadFile("testdata/chat/features.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &features); err != nil {
		t.Fatal(err)
	}
	inputs = append(inputs, features...)
	inputs = append(inputs,
		"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
		"{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
		"{{ ('x' * 1000)|replace('x', 'yyyyyyyyyyyyyyyy' * 1000) }}",
		"{{ [0] * 100000000 }}",
		"{{ messages|tojson(indent=100000000) }}",
	)
	return append(inputs, deepTemplates(5000)...)
}

// deepTemplates are expressions nested depth deep: in parentheses, and as
// a chain of additions.
func deepTemplates(depth int) []string {
	return []string{
		"{{ " + strings.Repeat("(", depth) + "1" + strings.Repeat(")", depth) + " }}",
		"{{ 1" + strings.Repeat("+1", depth) + " }}",
	}
}

var chatFuzzMessages = []Message{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}

// checkChatTemplate is FuzzChatTemplate's rule for one template.
func checkChatTemplate(t *testing.T, src string) {
	t.Helper()
	tk := chatTokenizer(map[string]string{"bos_token": "<s>", "eos_token": "</s>"}, "")
	out, err := tk.RenderChatTemplate(src, chatFuzzMessages, true)
	if err != nil {
		if strings.Contains(err.Error(), "internal error") {
			t.Fatalf("%q: %v", src, err)
		}
		return
	}
	if len(out) > maxOutput {
		t.Fatalf("rendered %d bytes, over the %d limit", len(out), maxOutput)
	}
}
