package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// slowRegex backtracks exponentially on a run of a's that does not end the
// text: 24 a's and a b took 2.5 s without a time limit, each a more doubles
// that.
const slowRegex = `(a+)+$`

// slowText is far past any time limit without one.
var slowText = strings.Repeat("a", 40) + "b"

// testMatchTimeout is the time limit the tests build with. regexp2 checks
// its deadline against a clock that ticks every 100 ms, so a match fails
// 100-200 ms after starting.
const testMatchTimeout = time.Millisecond

// patternTokenizerJSON returns a tokenizer.json over the vocabulary a, b, x
// with the given normalizer, pre_tokenizer and decoder ("null" for none).
func patternTokenizerJSON(normalizer, pre, decoder string) []byte {
	return fmt.Appendf(nil, `{"normalizer":%s,"pre_tokenizer":%s,"decoder":%s,
		"model":{"type":"BPE","vocab":{"a":0,"b":1,"x":2},"merges":[]}}`, normalizer, pre, decoder)
}

func buildPatternTokenizer(t *testing.T, tb []byte) *Tokenizer {
	t.Helper()
	tk, err := build(tb, nil, buildOptions{scanners: true, matchTimeout: testMatchTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// checkPatternError checks that err is a timed-out match of slowRegex used
// at where, and that it came quickly.
func checkPatternError(t *testing.T, err error, where string, elapsed time.Duration) {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	want := fmt.Sprintf(`%s pattern %q: a match ran over %v`, where, slowRegex, testMatchTimeout)
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want one containing %q", err, want)
	}
	if strings.Contains(err.Error(), slowText) {
		t.Errorf("error %q quotes the text", err)
	}
	var pe *patternError
	if !errors.As(err, &pe) || pe.err == nil || !strings.HasPrefix(pe.err.Error(), "match timeout") {
		t.Errorf("error %v does not wrap regexp2's timeout", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("took %v", elapsed)
	}
}

func TestPatternTimeout(t *testing.T) {
	split := `{"type":"Split","pattern":{"Regex":"(a+)+$"},"behavior":"Isolated","invert":false}`
	replace := `{"type":"Replace","pattern":{"Regex":"(a+)+$"},"content":"x"}`
	for _, c := range []struct {
		name                 string
		normalizer, pre, dec string
		where                string // of the pattern, in errors
		encodes              bool   // whether slowText fails Encode (else Decode)
		normal               string // encodes fine
		normalIDs            []int
		normalDecoded        string // of normalIDs
	}{
		{"pre_tokenizer", "null", split, "null", "pre_tokenizer Split", true, "abab", []int{0, 1, 0, 1}, "a b a b"},
		{"pre_tokenizer sequence", "null", `{"type":"Sequence","pretokenizers":[{"type":"WhitespaceSplit"},` + split + `]}`, "null",
			"pre_tokenizer.pretokenizers[1] Split", true, "ab ba", []int{0, 1, 1, 0}, "a b b a"},
		{"normalizer", replace, "null", "null", "normalizer Replace", true, "aba", []int{0, 1, 2}, "a b x"},
		{"decoder", "null", "null", `{"type":"Sequence","decoders":[{"type":"Fuse"},` + replace + `]}`,
			"decoder.decoders[1] Replace", false, "aba", []int{0, 1, 0}, "abx"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tk := buildPatternTokenizer(t, patternTokenizerJSON(c.normalizer, c.pre, c.dec))
			ids, err := tk.Encode(c.normal, false)
			if err != nil || !slices.Equal(ids, c.normalIDs) {
				t.Errorf("Encode(%q) = %v, %v; want %v", c.normal, ids, err, c.normalIDs)
			}
			if s, err := tk.Decode(c.normalIDs, false); err != nil || s != c.normalDecoded {
				t.Errorf("Decode(%v) = %q, %v; want %q", c.normalIDs, s, err, c.normalDecoded)
			}
			slowIDs := append(slices.Repeat([]int{0}, 40), 1)
			start := time.Now()
			ids, err = tk.Encode(slowText, false)
			if !c.encodes {
				if err != nil || !slices.Equal(ids, slowIDs) {
					t.Fatalf("Encode = %v, %v; want %v", ids, err, slowIDs)
				}
				start = time.Now()
				var s string
				s, err = tk.Decode(ids, false)
				if s != "" {
					t.Errorf("Decode gave %q with its error", s)
				}
			} else if ids != nil {
				t.Errorf("Encode gave %v with its error", ids)
			}
			checkPatternError(t, err, c.where, time.Since(start))
			if !strings.HasPrefix(err.Error(), "tokenizer: ") {
				t.Errorf("error %q does not name the package", err)
			}
			// A tokenizer read from a file names it.
			var pe *patternError
			errors.As(err, &pe)
			named := (&Tokenizer{src: "m/tokenizer.json"}).patternError(pe)
			if want := "tokenizer: m/tokenizer.json: " + c.where; !strings.HasPrefix(named.Error(), want) {
				t.Errorf("error %q, want it to begin %q", named, want)
			}
		})
	}
}

func TestPatternTimeoutStream(t *testing.T) {
	tk := buildPatternTokenizer(t, patternTokenizerJSON("null", "null",
		`{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"Regex":"(a+)+$"},"content":"x"}]}`))
	sd := tk.NewStreamDecoder()
	start := time.Now()
	var err error
	for _, id := range append(slices.Repeat([]int{0}, 40), 1) {
		if _, err = sd.Add(id); err != nil {
			break
		}
	}
	checkPatternError(t, err, "decoder.decoders[1] Replace", time.Since(start))
	// The decoder was reset: it goes on with new text.
	if s, err := sd.Add(1); err != nil || s != "b" {
		t.Errorf("Add after the error = %q, %v; want \"b\"", s, err)
	}
	if s, err := sd.Flush(); err != nil || s != "" {
		t.Errorf("Flush = %q, %v", s, err)
	}
}

// TestPatternTimeoutAddedTokens: an added token's content runs through the
// normalizer when the tokenizer is built.
func TestPatternTimeoutAddedTokens(t *testing.T) {
	tb := []byte(`{"normalizer":{"type":"Replace","pattern":{"Regex":"(a+)+$"},"content":"x"},
		"added_tokens":[{"id":3,"content":"` + slowText + `","normalized":true}],
		"model":{"type":"BPE","vocab":{"a":0,"b":1,"x":2},"merges":[]}}`)
	start := time.Now()
	_, err := build(tb, nil, buildOptions{scanners: true, matchTimeout: testMatchTimeout})
	checkPatternError(t, err, "normalizer Replace", time.Since(start))
	if !strings.HasPrefix(err.Error(), "added_tokens: ") {
		t.Errorf("error %q does not name added_tokens", err)
	}
}

// TestPatternTimeoutDefault: the public constructors give every regexp2
// matcher the default time limit.
func TestPatternTimeoutDefault(t *testing.T) {
	tk, err := FromJSON(patternTokenizerJSON("null",
		`{"type":"Split","pattern":{"Regex":"(a+)+$"},"behavior":"Isolated","invert":false}`, "null"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := tk.pre.(preSplit).m.(*regexMatcher)
	if !ok || m.re.MatchTimeout != defaultMatchTimeout || m.pattern != slowRegex || m.where != "pre_tokenizer Split" {
		t.Errorf("matcher %#v", tk.pre.(preSplit).m)
	}
}

// TestPatternFailureRepanics: only a pattern's failure is recovered.
func TestPatternFailureRepanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recovered %v, want the original panic", r)
		}
	}()
	func() {
		defer func() { patternFailure(recover()) }()
		panic("boom")
	}()
	t.Error("no panic")
}
