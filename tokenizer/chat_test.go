package tokenizer

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type chatExpected struct {
	Templates map[string]struct {
		Specials map[string]string `json:"specials"`
		Results  []chatResult      `json:"results"`
	} `json:"templates"`
	Features []struct {
		chatResult
		Template string `json:"template"`
	} `json:"features"`
}

type chatResult struct {
	OK    bool   `json:"ok"`
	Text  string `json:"text"`
	Error string `json:"error"`
}

func loadChatExpected(t *testing.T) chatExpected {
	b, err := os.ReadFile("testdata/chat/expected.json")
	if err != nil {
		t.Fatal(err)
	}
	var exp chatExpected
	if err := json.Unmarshal(b, &exp); err != nil {
		t.Fatal(err)
	}
	return exp
}

// chatTokenizer is a tokenizer with only the chat-template configuration,
// enough to render templates.
func chatTokenizer(specials map[string]string, template string) *Tokenizer {
	tk := &Tokenizer{}
	c := &tk.cfg
	c.bos, c.hasBOS = specials["bos_token"]
	c.eos, c.hasEOS = specials["eos_token"]
	c.unk, c.hasUnk = specials["unk_token"]
	c.pad, c.hasPad = specials["pad_token"]
	c.chatTemplate, c.hasChatTemplate = template, true
	return tk
}

func checkChat(t *testing.T, what string, want chatResult, got string, err error) {
	t.Helper()
	switch {
	case want.OK && err != nil:
		t.Errorf("%s: error %v, Jinja2 renders %q", what, err, want.Text)
	case !want.OK && err == nil:
		t.Errorf("%s: rendered %q, Jinja2 fails with %s", what, got, want.Error)
	case want.OK && got != want.Text:
		t.Errorf("%s:\n got %q\nwant %q", what, got, want.Text)
	}
}

// TestChatTemplatesMatchJinja2 renders the real (and remembered) model
// templates over several conversations and compares with Python Jinja2.
func TestChatTemplatesMatchJinja2(t *testing.T) {
	exp := loadChatExpected(t)
	b, err := os.ReadFile("testdata/chat/convs.json")
	if err != nil {
		t.Fatal(err)
	}
	var convs [][]struct{ Role, Content string }
	if err := json.Unmarshal(b, &convs); err != nil {
		t.Fatal(err)
	}
	for name, tc := range exp.Templates {
		src, err := os.ReadFile(filepath.Join("testdata/chat", name+".jinja"))
		if err != nil {
			t.Fatal(err)
		}
		tk := chatTokenizer(tc.Specials, string(src))
		k := 0
		for ci, conv := range convs {
			msgs := make([]Message, len(conv))
			for i, m := range conv {
				msgs[i] = Message{Role: m.Role, Content: m.Content}
			}
			for _, agp := range []bool{false, true} {
				got, err := tk.ApplyChatTemplate(msgs, agp)
				checkChat(t, name+" conv "+string(rune('0'+ci)), tc.Results[k], got, err)
				k++
			}
		}
	}
}

// unsupportedFeatures lists feature templates that Jinja2 renders but this
// engine rejects with an error (never a different text).
var unsupportedFeatures = map[string]bool{
	"{{ '%s' % 'x' }}": true,
}

func TestJinjaFeatures(t *testing.T) {
	exp := loadChatExpected(t)
	tk := chatTokenizer(map[string]string{"bos_token": "<s>"}, "")
	msgs := []Message{{"user", "Hi"}, {"assistant", "Yo"}}
	for _, f := range exp.Features {
		got, err := tk.RenderChatTemplate(f.Template, msgs, true)
		if unsupportedFeatures[f.Template] {
			if err == nil || !strings.Contains(err.Error(), "not supported") {
				t.Errorf("%q: want a not-supported error, got %q, %v", f.Template, got, err)
			}
			continue
		}
		checkChat(t, f.Template, f.chatResult, got, err)
	}
}

func TestChatTemplateFixtures(t *testing.T) {
	dir, g := loadGolden(t)
	msgs := []Message{{"system", "Be brief."}, {"user", "Hello!"}, {"assistant", "Hi."}, {"user", "Bye"}}
	for _, name := range sortedKeys(g) {
		tk := fixtureTokenizer(t, dir, name)
		out, err := tk.ApplyChatTemplate(msgs, true)
		if !tk.HasChatTemplate() {
			if !errors.Is(err, ErrNoChatTemplate) {
				t.Errorf("%s: no template, want ErrNoChatTemplate, got %v", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		// The rendered prompt's special tokens encode as single ids.
		ids := mustEncode(t, tk, out, false)
		if len(ids) == 0 || !strings.Contains(out, "Hello!") {
			t.Errorf("%s: prompt %q encodes to %v", name, out, ids)
		}
	}
}

func TestChatTemplateErrors(t *testing.T) {
	tk := chatTokenizer(nil, "")
	for _, src := range append([]string{
		"{% for %}", "{{ 1 + }}", "{% if x %}", "{{ x | nosuch }}", "{% import 'x' as y %}",
		"{{ 'unterminated }}", "{% set a, b = 1, 2 %}", "{{ messages[0].content.append('x') }}",
		// Templates that would crash or exhaust the program rendering them.
		"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
		"{{ 'x' * 100000000000 }}",
		"{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
		"{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
	}, deepTemplates(100000)...) {
		if out, err := tk.RenderChatTemplate(src, []Message{{"user", "x"}}, false); err == nil {
			t.Errorf("%q: rendered %q, want an error", src, out)
		}
	}
}

// TestTojsonNegativeIndent: a negative indent is no indent, as in Python's
// json.dumps, not a size error from the bound on values.
func TestTojsonNegativeIndent(t *testing.T) {
	out, err := chatTokenizer(nil, "").RenderChatTemplate("{{ [1]|tojson(indent=-1) }}", nil, false)
	if want := "[\n1\n]"; err != nil || out != want {
		t.Errorf("got %q, %v; want %q", out, err, want)
	}
}
