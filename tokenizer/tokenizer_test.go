package tokenizer

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// alphabet holds characters that exercise every branch of the pre-tokenizer
// patterns: letters, marks, digits of several scripts, white space of
// several kinds, punctuation, symbols, CJK, emoji, apostrophe contractions.
var alphabet = []string{
	"a", "Z", "é", "ß", "Ω", "я", "中", "語", "の", "カ", "한", "\u0301", "\u0903",
	"0", "7", "٣", "Ⅻ", "½",
	" ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2028", "\u200b", "\u0085", "\v",
	"'", "'s", "'T", "'re", "'VE", "'m", "'ll", "'D", "'x",
	"!", ".", ",", "-", "_", "(", "]", "\"", "#", "@", "~", "`", "\\", "/", "、", "。", "«",
	"$", "+", "<", "=", "©", "™", "∑", "😀", "👍🏽", "\x00", "\x1b",
	"<|im_start|>", "<|endoftext|>", "<｜begin▁of▁sentence｜>", "<s>", "</s>", "<think>",
}

func randomText(r *rand.Rand, n int) string {
	var sb strings.Builder
	for range n {
		sb.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return sb.String()
}

// mustEncode is tk.Encode for tokenizers whose regexes cannot time out.
func mustEncode(t testing.TB, tk *Tokenizer, s string, addSpecial bool) []int {
	t.Helper()
	ids, err := tk.Encode(s, addSpecial)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// mustDecode is tk.Decode for tokenizers whose regexes cannot time out.
func mustDecode(t testing.TB, tk *Tokenizer, ids []int, skipSpecial bool) string {
	t.Helper()
	s, err := tk.Decode(ids, skipSpecial)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func allMatches(m matcher, s string) [][2]int {
	var out [][2]int
	for at := 0; at < len(s); {
		st, e := m.find(s, at)
		if st < 0 {
			break
		}
		out = append(out, [2]int{st, e})
		if e == st {
			e++
		}
		at = e
	}
	return out
}

func checkScanners(t *testing.T, s string) {
	t.Helper()
	pairs, err := scannerPairs()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		a, b := allMatches(p.fast, s), allMatches(p.slow, s)
		if len(a) != len(b) {
			t.Fatalf("pattern %q on %q:\nscanner %v\nregexp2 %v", p.pat, s, a, b)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("pattern %q on %q:\nscanner %v\nregexp2 %v", p.pat, s, a, b)
			}
		}
	}
}

// scannerPair is a pattern compiled to its hand-written scanner and to
// the general regex engine.
type scannerPair struct {
	pat        string
	fast, slow matcher
}

// scannerPairs compiles every pattern that has a scanner, once per test
// binary: compiling them for each input took most of FuzzScanners' time.
var scannerPairs = sync.OnceValues(func() ([]scannerPair, error) {
	var pairs []scannerPair
	for _, pat := range slices.Sorted(maps.Keys(scanners)) {
		fast, err := compilePattern(pat, false, "test", &buildOptions{scanners: true})
		if err != nil {
			return nil, err
		}
		slow, err := compilePattern(pat, false, "test", &buildOptions{})
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, scannerPair{pat, fast, slow})
	}
	return pairs, nil
})

// TestScannersMatchRegexp2 checks each hand-written scanner against the
// general regex engine running the same pattern.
func TestScannersMatchRegexp2(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		checkScanners(t, randomText(r, 1+r.IntN(40)))
	}
}

// FuzzScanners compares each hand-written pre-tokenizer scanner with
// regexp2 running its pattern, on texts of up to maxFuzzText bytes: a
// pre-token is a word or a run of spaces, and the fuzzer minimizes every
// input that finds new coverage at a cost that grows with the square of its
// length, so longer inputs cost time and find nothing more.
func FuzzScanners(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  x \n\n y", "it's 'LL", "a1234b", "中文and", " !!\n", "\u00a0 \t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > maxFuzzText || !utf8.ValidString(s) || strings.ContainsRune(s, 'ſ') {
			// Scanners see valid UTF-8 only; regexp2 does not fold ſ to s
			// as Oniguruma does.
			return
		}
		checkScanners(t, s)
	})
}

// maxFuzzText bounds the texts of FuzzScanners and FuzzRoundTrip.
const maxFuzzText = 256

func TestLossy(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD"},                 // truncated 3-byte sequence: one U+FFFD
		{"\xe2\x82a", "\uFFFDa"},               // same, followed by ASCII
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate: ED then A0 is out of range
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
	} {
		if got := validUTF8(c.in); got != c.want {
			t.Errorf("validUTF8(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	base := `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,`
	for _, c := range []struct{ json, field string }{
		{`{`, "parse"},
		{base + `"model":{"type":"Unigram","vocab":[]}}`, "model.type"},
		{base + `"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}}`, "model.merges[0]"},
		{base + `"model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"<unk>"}}`, "model.unk_token"},
		{base + `"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.1}}`, "model.dropout"},
		{`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?<"},"behavior":"Isolated","invert":false},"model":{"type":"BPE","vocab":{},"merges":[]}}`, "pre_tokenizer.pattern.Regex"},
		{`{"normalizer":{"type":"Precompiled"},"model":{"type":"BPE","vocab":{},"merges":[]}}`, "normalizer.type"},
		{`{"decoder":{"type":"Sequence","decoders":[{"type":"CTC"}]},"model":{"type":"BPE","vocab":{},"merges":[]}}`, "decoder.decoders[0].type"},
		{`{"model":{"type":"BPE","vocab":{},"merges":[]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}}],"special_tokens":{}}}`, "post_processor.single[0]"},
	} {
		_, err := FromJSON([]byte(c.json), nil)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v, want one naming %q", c.json, err, c.field)
		}
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("Load of an empty dir: %v, want an error naming tokenizer.json", err)
	}
}

func TestSpecialTokensAndStream(t *testing.T) {
	dir, _ := loadGolden(t)
	for _, c := range []struct {
		name     string
		bos, eos string
	}{
		{"deepseek_v3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
		{"qwen3", "", "<|im_end|>"},
		{"llama2", "<s>", "</s>"},
	} {
		tk := fixtureTokenizer(t, dir, c.name)
		for _, x := range []struct {
			get  func() (int, bool)
			want string
		}{{tk.BOS, c.bos}, {tk.EOS, c.eos}} {
			id, ok := x.get()
			if ok != (x.want != "") {
				t.Errorf("%s: special token %q: ok=%v", c.name, x.want, ok)
				continue
			}
			if ok {
				if s, _ := tk.Token(id); s != x.want || !tk.IsSpecial(id) {
					t.Errorf("%s: id %d is %q, want special %q", c.name, id, s, x.want)
				}
			}
		}
		// A 4-byte emoji split over byte tokens comes out whole.
		ids := mustEncode(t, tk, "ok 😀👍🏽!", false)
		sd := tk.NewStreamDecoder()
		var chunks []string
		for _, id := range ids {
			s, err := sd.Add(id)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if s != "" {
				if !utf8.ValidString(s) || strings.Contains(s, "\uFFFD") {
					t.Errorf("%s: chunk %q splits a character", c.name, s)
				}
				chunks = append(chunks, s)
			}
		}
		rest, err := sd.Flush()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		chunks = append(chunks, rest)
		if got := strings.Join(chunks, ""); got != "ok 😀👍🏽!" {
			t.Errorf("%s: streamed %q", c.name, got)
		}
		if tk.VocabSize() <= 0 {
			t.Errorf("%s: VocabSize %d", c.name, tk.VocabSize())
		}
	}
}
