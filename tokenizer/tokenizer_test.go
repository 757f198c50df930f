package tokenizer

import (
	"math/rand/v2"
	"strings"
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
	for pat := range scanners {
		fast, err := compilePattern(pat, false, true)
		if err != nil {
			t.Fatal(err)
		}
		slow, err := compilePattern(pat, false, false)
		if err != nil {
			t.Fatal(err)
		}
		a, b := allMatches(fast, s), allMatches(slow, s)
		if len(a) != len(b) {
			t.Fatalf("pattern %q on %q:\nscanner %v\nregexp2 %v", pat, s, a, b)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("pattern %q on %q:\nscanner %v\nregexp2 %v", pat, s, a, b)
			}
		}
	}
}

// TestScannersMatchRegexp2 checks each hand-written scanner against the
// general regex engine running the same pattern.
func TestScannersMatchRegexp2(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		checkScanners(t, randomText(r, 1+r.IntN(40)))
	}
}

func FuzzScanners(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  x \n\n y", "it's 'LL", "a1234b", "中文and", " !!\n", "\u00a0 \t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 'ſ') {
			// Scanners see valid UTF-8 only; regexp2 does not fold ſ to s
			// as Oniguruma does.
			return
		}
		checkScanners(t, s)
	})
}

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
