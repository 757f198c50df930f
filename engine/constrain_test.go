package engine

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/tokenizer"
)

// jsonCases are texts, whether the recognizer takes each whole as a prefix
// of a JSON object, and whether it is then done.
var jsonCases = []struct {
	text         string
	prefix, done bool
}{
	{`{}`, true, true},
	{` { "a" : [1, -2.5e+3, 0, true, false, null, "x\"\\\u00e9"], "b": {"c": []} }`, true, true},
	{`{"a": 1`, true, false},
	{`{"a": -`, true, false},
	{`{"a": 0.`, true, false},
	{`{"a": "\u00`, true, false},
	{`{"a": tr`, true, false},
	{`[1]`, false, false},
	{`"a"`, false, false},
	{`{"a" 1}`, false, false},
	{`{"a": 01}`, false, false},
	{`{"a": 1.}`, false, false},
	{`{"a": -}`, false, false},
	{`{"a": tru}`, false, false},
	{`{"a": "\x"}`, false, false},
	{`{"a": 1,}`, false, false},
	{`{,}`, false, false},
	{`{"a": [1,]}`, false, false},
	{`{"a": [}`, false, false},
	{`{}}`, false, true},
	{`{} `, false, true}, // nothing after the object
	{"{\"a\": \"\n\"}", false, false},
	{`{"a":` + strings.Repeat(" ", maxJSONSpaces+1) + `1}`, false, false},
	{strings.Repeat(`{"a":`, maxJSONDepth+1), false, false},
}

// feedAll feeds text to s and returns the index of the first byte refused,
// or -1.
func feedAll(s *jsonState, text string) int {
	for i := range len(text) {
		if !s.feed(text[i]) {
			return i
		}
	}
	return -1
}

// TestJSONState holds the recognizer to encoding/json: a text is accepted
// whole when it is a prefix of a JSON object (and only then), and done when
// it is one.
func TestJSONState(t *testing.T) {
	for _, tc := range jsonCases {
		var s jsonState
		ok := feedAll(&s, tc.text) < 0
		if ok != tc.prefix || s.done() != tc.done {
			t.Errorf("%q: prefix %v done %v, want %v %v", tc.text, ok, s.done(), tc.prefix, tc.done)
		}
		if tc.done && tc.prefix && !json.Valid([]byte(tc.text)) {
			t.Errorf("%q: encoding/json disagrees", tc.text)
		}
	}
}

// jsonVocab is a tokenizer vocabulary of JSON's characters and a few words.
var jsonVocab = []string{"<s>", "</s>", "{", "}", "[", "]", `"`, ":", ",", " ", "\n", "0", "1", "2", "7", "-", ".", "e",
	"a", "b", "c", "x", "y", "z", `\`, "u", "true", "false", "null", `{"`, `":`, `",`, `"}`, "ab", "key", "val", "12",
	"q", "r", "s", "t", "n", "l", "f", "+", "E", "3", "4", "5", "6", "8", "9", "A", "B", "C", "D", "F", "g", "h", "i",
	"j", "k", "m", "o"}

// TestJSONConstraint: generations under the JSON constraint, greedy and
// sampled, are JSON-object prefixes and, when they stop on the EOS token, a
// whole object.
func TestJSONConstraint(t *testing.T) {
	m := tinyTextModel(t, 13, func(i int) string { return jsonVocab[i] }, `{"type":"Fuse"}`)
	done := 0
	for seed := range uint64(6) {
		s, err := m.NewSession(0)
		if err != nil {
			t.Fatal(err)
		}
		con, err := m.NewJSONConstraint([]int{1})
		if err != nil {
			t.Fatal(err)
		}
		o := SamplingOptions{Temperature: 1, Seed: seed}
		if seed == 0 {
			o = SamplingOptions{}
		}
		res, err := s.Generate(context.Background(), []int{2, 6}, GenerateOptions{MaxTokens: 1500, StopTokens: []int{1}, Sampling: o, Constraint: con, LogProbs: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		gen := res.Tokens
		if res.Reason == StopToken {
			gen = gen[:len(gen)-1] // </s> has a text in this vocabulary
		}
		text, err := m.Decode(gen)
		if err != nil {
			t.Fatal(err)
		}
		var st jsonState
		if i := feedAll(&st, text); i >= 0 {
			t.Fatalf("seed %d: %q is not a JSON-object prefix at byte %d", seed, text, i)
		}
		if res.Reason == StopToken {
			done++
			if !json.Valid([]byte(text)) || !st.done() {
				t.Errorf("seed %d: stopped on EOS with %q", seed, text)
			}
		}
	}
	if done == 0 {
		t.Error("no generation closed its object")
	}
}

// BenchmarkJSONMask is the time of one step's mask over Qwen3's vocabulary
// (151k tokens) inside a string and between values, for a state seen
// before (the cached set applied) and for a new one (every token tried).
func BenchmarkJSONMask(b *testing.B) {
	tok, err := tokenizer.Load(filepath.Join(golden.Dir(b), "tokenizers", "qwen3"))
	if err != nil {
		b.Fatal(err)
	}
	toks := make([][]byte, tok.VocabSize())
	for id := range toks {
		s, _ := tok.Decode([]int{id}, true)
		toks[id] = []byte(s)
	}
	logits := make([]float32, len(toks))
	for _, prefix := range []string{`{"name": "Jo`, `{"a": [1, 2`} {
		b.Run(prefix, func(b *testing.B) {
			c := &jsonConstraint{masks: &jsonMasks{toks: toks, byState: map[string][]uint64{}}, stops: []int{151645}}
			for i := range len(prefix) {
				c.st.feed(prefix[i])
			}
			b.Run("cached", func(b *testing.B) {
				for b.Loop() {
					c.Mask(logits)
				}
			})
			b.Run("new", func(b *testing.B) {
				for b.Loop() {
					clear(c.masks.byState)
					c.Mask(logits)
				}
			})
		})
	}
}

const testSchema = `{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
	"tags": {"type": "array", "items": {"type": "string", "enum": ["x", "yz"]}}, "ok": {"type": "boolean"}, "n": {"type": "null"}}}`

// TestJSONSchemaState: with a schema, the recognizer takes exactly the
// objects that follow it, properties in order.
func TestJSONSchemaState(t *testing.T) {
	sch, err := compileSchema([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		text         string
		prefix, done bool
	}{
		{`{"name": "Jo", "age": -3, "tags": ["x", "yz"], "ok": true, "n": null}`, true, true},
		{`{"name":"","age":0,"tags":[],"ok":false,"n":null}`, true, true},
		{`{"name": "Jo", "ag`, true, false},
		{`{"name": "Jo", "age": 3, "tags": ["y`, true, false},
		{`{"age": 3`, false, false},
		{`{"name": 1`, false, false},
		{`{"name": "a", "age": 3.5`, false, false},
		{`{"name": "a", "age": 3e2`, false, false},
		{`{"name": "a", "age": 3, "tags": ["z"`, false, false},
		{`{"name": "a", "age": 3, "tags": ["y"`, false, false},
		{`{"name": "a", "age": 3}`, false, false},
		{`{}`, false, false},
		{`{"name": "a", "age": 3, "tags": [], "ok": false, "n": null, "x": 1}`, false, false},
		{`{"name": "a", "age": 3, "tags": [], "ok": false, "n": null,`, false, false},
	} {
		s := jsonState{sch: sch}
		ok := feedAll(&s, tc.text) < 0
		if ok != tc.prefix || s.done() != tc.done {
			t.Errorf("%q: prefix %v done %v, want %v %v", tc.text, ok, s.done(), tc.prefix, tc.done)
		}
	}
	for _, bad := range []string{`{"type": "array", "items": {"type": "string"}}`, `{"anyOf": []}`, `{"type": "object", "properties": {"a": {"type": "string", "enum": ["\""]}}}`,
		`{"type": "object", "properties": {"a": {"type": "array"}}}`, `{"type": "object", "properties": []}`, `nope`} {
		if _, err := compileSchema([]byte(bad)); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: %v, want ErrSchema", bad, err)
		}
	}
}

// TestJSONSchemaConstraint: generations under a schema constraint follow it.
func TestJSONSchemaConstraint(t *testing.T) {
	m := tinyTextModel(t, 17, func(i int) string { return jsonVocab[i] }, `{"type":"Fuse"}`)
	schema := `{"type": "object", "properties": {"ab": {"type": "integer"}, "key": {"type": "string", "enum": ["x", "yz"]},
		"c": {"type": "array", "items": {"type": "boolean"}}}}`
	sch, _ := compileSchema([]byte(schema))
	done := 0
	for seed := range uint64(6) {
		s, _ := m.NewSession(0)
		con, err := m.NewJSONSchemaConstraint([]byte(schema), []int{1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Generate(context.Background(), []int{2}, GenerateOptions{MaxTokens: 1500, StopTokens: []int{1},
			Sampling: SamplingOptions{Temperature: 1, Seed: seed}, Constraint: con}, nil)
		if err != nil {
			t.Fatal(err)
		}
		gen := res.Tokens
		if res.Reason == StopToken {
			gen = gen[:len(gen)-1]
		}
		text, _ := m.Decode(gen)
		st := jsonState{sch: sch}
		if i := feedAll(&st, text); i >= 0 {
			t.Fatalf("seed %d: %q does not follow the schema at byte %d", seed, text, i)
		}
		if res.Reason == StopToken {
			done++
			var v struct {
				AB  *int   `json:"ab"`
				Key string `json:"key"`
				C   []bool `json:"c"`
			}
			if err := json.Unmarshal([]byte(text), &v); err != nil || v.AB == nil || (v.Key != "x" && v.Key != "yz") {
				t.Errorf("seed %d: %q: %v", seed, text, err)
			}
		}
	}
	if done == 0 {
		t.Error("no generation closed its object")
	}
}

// TestJSONMaskMatchesEveryToken: the mask of a new state, computed by first
// byte and over several goroutines, is the set of tokens whose every byte
// the state takes, token by token, with and without a schema.
func TestJSONMaskMatchesEveryToken(t *testing.T) {
	tok, err := tokenizer.Load(filepath.Join(golden.Dir(t), "tokenizers", "qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	toks := make([][]byte, tok.VocabSize())
	for id := range toks {
		s, _ := tok.Decode([]int{id}, true)
		toks[id] = []byte(s)
	}
	sch, err := compileSchema([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prefix string
		sch    *jsonSchema
	}{
		{"", nil}, {`{"name": "Jo`, nil}, {`{"a": [1, 2`, nil}, {`{"a": -0.`, nil}, {`{"a": tr`, nil}, {`{"a": {"b": [`, nil},
		{`{"a": "\u00`, nil}, {"", sch}, {`{"name": "x", "age": 1`, sch}, {`{"name": "x", "age": 12, "tags": ["y`, sch},
	} {
		var st jsonState
		st.sch = tc.sch
		for i := range len(tc.prefix) {
			if !st.feed(tc.prefix[i]) {
				t.Fatalf("%q: the recognizer refuses its own test prefix at byte %d", tc.prefix, i)
			}
		}
		got := (&jsonMasks{toks: toks, byState: map[string][]uint64{}}).of(&st)
		want := make([]uint64, len(got))
		allowed := 0
		for id, b := range toks {
			s, ok := st, len(b) > 0
			for _, ch := range b {
				if ok = s.feed(ch); !ok {
					break
				}
			}
			if ok {
				want[id/64] |= 1 << (id % 64)
				allowed++
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%q (schema %v): the mask differs from trying every token", tc.prefix, tc.sch != nil)
		}
		t.Logf("%q (schema %v): %d tokens allowed", tc.prefix, tc.sch != nil, allowed)
	}
}

// TestJSONMaskSetsForbiddenLogits: Mask leaves the logits of the allowed
// tokens and sets every other one to -Inf, whatever mix of words (all
// allowed, none, some) the mask holds and with a vocabulary not a multiple
// of 64.
func TestJSONMaskSetsForbiddenLogits(t *testing.T) {
	const vocab = 64*5 + 17
	allowed := []uint64{^uint64(0), 0, 0x8000_0000_0000_0001, ^uint64(0) &^ (1 << 33), 0x5555, 1<<16 | 1}
	var st jsonState
	st.feed('{')
	c := &jsonConstraint{masks: &jsonMasks{byState: map[string][]uint64{st.cacheKey(): allowed}}, st: st}
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(i)
	}
	c.Mask(logits)
	for i, l := range logits {
		want := float32(i)
		if allowed[i/64]&(1<<(i%64)) == 0 {
			want = float32(math.Inf(-1))
		}
		if l != want {
			t.Fatalf("logit %d = %v, want %v", i, l, want)
		}
	}
}
