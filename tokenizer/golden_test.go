package tokenizer

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/manifoldlm/manifold/internal/golden"
)

// goldenDir returns the tokenizers folder of the golden fixtures, found as
// internal/golden finds them (MANIFOLD_GOLDEN_DIR, relative to the module
// root when relative, else ../shared/golden), skipping the test without
// them.
func goldenDir(t testing.TB) string {
	t.Helper()
	d := golden.Path(t, "tokenizers")
	if _, err := os.Stat(filepath.Join(d, "golden.json")); err != nil {
		t.Skipf("SKIPPED, nothing checked: this fixture set has no tokenizer fixtures: %v", err)
	}
	return d
}

type goldenCase struct {
	Text           string `json:"text"`
	IDs            []int  `json:"ids"`
	IDsWithSpecial []int  `json:"ids_with_special"`
	Decoded        string `json:"decoded"`
}

func loadGolden(t testing.TB) (string, map[string][]goldenCase) {
	dir := goldenDir(t)
	b, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g map[string][]goldenCase
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("golden.json: %v", err)
	}
	return dir, g
}

// fixtureCache shares loaded fixture tokenizers between tests.
type fixtureCache struct {
	mu   sync.Mutex
	toks map[string]*Tokenizer
}

var fixtures = &fixtureCache{toks: map[string]*Tokenizer{}}

func fixtureTokenizer(t testing.TB, dir, name string) *Tokenizer {
	t.Helper()
	fixtures.mu.Lock()
	defer fixtures.mu.Unlock()
	if tk, ok := fixtures.toks[name]; ok {
		return tk
	}
	tk, err := Load(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	fixtures.toks[name] = tk
	return tk
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func TestGolden(t *testing.T) {
	dir, g := loadGolden(t)
	for _, name := range sortedKeys(g) {
		t.Run(name, func(t *testing.T) {
			tk := fixtureTokenizer(t, dir, name)
			for i, c := range g[name] {
				if got := mustEncode(t, tk, c.Text, false); !slices.Equal(got, c.IDs) {
					t.Errorf("case %d %q: Encode(addSpecial=false)\n got %v\nwant %v", i, c.Text, got, c.IDs)
				}
				if got := mustEncode(t, tk, c.Text, true); !slices.Equal(got, c.IDsWithSpecial) {
					t.Errorf("case %d %q: Encode(addSpecial=true)\n got %v\nwant %v", i, c.Text, got, c.IDsWithSpecial)
				}
				if got := mustDecode(t, tk, c.IDs, false); got != c.Decoded {
					t.Errorf("case %d: Decode\n got %q\nwant %q", i, got, c.Decoded)
				}
			}
		})
	}
}

// roundTripForm returns the text decode(encode(x)) must give back, or false
// where the tokenizer is lossy by design: Unicode normalizers change x to
// its normal form, SentencePiece-style tokenizers decode "▁" as a space,
// and their Strip decoder eats the space that follows a leading added token.
func roundTripForm(tk *Tokenizer, x string) (string, bool) {
	var walk func(n normalizer) bool
	walk = func(n normalizer) bool {
		switch v := n.(type) {
		case normSequence:
			for _, m := range v {
				if !walk(m) {
					return false
				}
			}
		case normForm:
			x = v.f.String(x)
		case normPrepend, normReplace:
			if strings.Contains(x, "▁") {
				return false
			}
			for content := range tk.added.byContent {
				if strings.Contains(x, content) {
					return false
				}
			}
		case nil:
		default:
			return false
		}
		return true
	}
	if !walk(tk.normalizer) {
		return "", false
	}
	if _, ok := tk.pre.(preMetaspace); ok && strings.Contains(x, "▁") {
		return "", false
	}
	return x, true
}

func roundTrip(t *testing.T, tk *Tokenizer, name, x string) {
	t.Helper()
	ids := mustEncode(t, tk, x, false)
	got := mustDecode(t, tk, ids, false)
	if !utf8.ValidString(x) {
		if !utf8.ValidString(got) {
			t.Errorf("%s: Decode returned invalid UTF-8 for %q", name, x)
		}
		return
	}
	want, ok := roundTripForm(tk, x)
	if !ok {
		return
	}
	if got != want {
		t.Errorf("%s: decode(encode(%q)) = %q (ids %v)", name, x, got, ids)
	}
	// Streaming gives the same text.
	sd := tk.NewStreamDecoder()
	var sb strings.Builder
	for _, id := range ids {
		chunk, err := sd.Add(id)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if strings.Contains(chunk, "\uFFFD") && !strings.Contains(got, "\uFFFD") {
			t.Errorf("%s: stream chunk %q of %q holds a partial character", name, chunk, x)
		}
		sb.WriteString(chunk)
	}
	rest, err := sd.Flush()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	sb.WriteString(rest)
	if sb.String() != got {
		t.Errorf("%s: streamed %q, Decode %q", name, sb.String(), got)
	}
}

func TestRoundTrip(t *testing.T) {
	dir, g := loadGolden(t)
	r := rand.New(rand.NewPCG(3, 4))
	texts := []string{"\xff\xfe", "a\xe2\x82", "\xed\xa0\x80x", "ok \xc0\xaf!"}
	for range 150 {
		texts = append(texts, randomText(r, 1+r.IntN(30)))
	}
	// FuzzRoundTrip's corpus, its inputs longer than the fuzz target takes included.
	texts = append(texts, corpusStrings(t, "testdata/fuzz/FuzzRoundTrip")...)
	for _, name := range sortedKeys(g) {
		tk := fixtureTokenizer(t, dir, name)
		for _, c := range g[name] {
			roundTrip(t, tk, name, c.Text)
		}
		for _, x := range texts {
			roundTrip(t, tk, name, x)
		}
	}
}

// corpusStrings reads the string inputs of a fuzz corpus folder (files of
// "go test fuzz v1" and one string(...) line).
func corpusStrings(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus in %s: %v", dir, err)
	}
	var out []string
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lit, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "go test fuzz v1\nstring(")
		lit, ok2 := strings.CutSuffix(lit, ")")
		s, err := strconv.Unquote(lit)
		if !ok || !ok2 || err != nil {
			t.Fatalf("%s: not one string input", name)
		}
		out = append(out, s)
	}
	return out
}

// FuzzRoundTrip holds the fixture tokenizers to roundTrip's rule on texts of
// up to maxFuzzText bytes (see FuzzScanners for the bound).
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"Hello, world!", "  x\n\n\ty", "日本語 😀", "it's", "\xff", "a\xe2\x82", "<|im_start|>user\nhi"} {
		f.Add(s)
	}
	dir, g := loadGolden(f)
	names := sortedKeys(g)
	toks := make([]*Tokenizer, len(names))
	for i, n := range names {
		toks[i] = fixtureTokenizer(f, dir, n)
	}
	f.Fuzz(func(t *testing.T, x string) {
		if len(x) > maxFuzzText {
			return
		}
		for i, tk := range toks {
			roundTrip(t, tk, names[i], x)
		}
	})
}

// TestHFEdgeCases compares with HuggingFace tokenizers 0.23.2 on 617 edge
// and random strings (testdata/hf_edge.json, made on the device machine by
// encoding with the fixture tokenizer.json files). It runs for each fixture
// whose tokenizer.json is byte-identical to the one used then.
func TestHFEdgeCases(t *testing.T) {
	dir, _ := loadGolden(t)
	b, err := os.ReadFile("testdata/hf_edge.json")
	if err != nil {
		t.Fatal(err)
	}
	var hf struct {
		Tokenizers map[string]struct {
			SHA256 string       `json:"sha256"`
			Cases  []goldenCase `json:"cases"`
		} `json:"tokenizers"`
	}
	if err := json.Unmarshal(b, &hf); err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(hf.Tokenizers) {
		tj, err := os.ReadFile(filepath.Join(dir, name, "tokenizer.json"))
		if err != nil || fmt.Sprintf("%x", sha256.Sum256(tj)) != hf.Tokenizers[name].SHA256 {
			t.Logf("%s: fixture differs from the one the edge cases were made with; skipped", name)
			continue
		}
		tk := fixtureTokenizer(t, dir, name)
		for i, c := range hf.Tokenizers[name].Cases {
			if got := mustEncode(t, tk, c.Text, false); !slices.Equal(got, c.IDs) {
				t.Errorf("%s case %d %q:\n got %v\nwant %v", name, i, c.Text, got, c.IDs)
			}
			if got := mustEncode(t, tk, c.Text, true); !slices.Equal(got, c.IDsWithSpecial) {
				t.Errorf("%s case %d %q with special:\n got %v\nwant %v", name, i, c.Text, got, c.IDsWithSpecial)
			}
			if got := mustDecode(t, tk, c.IDs, false); got != c.Decoded {
				t.Errorf("%s case %d: Decode %q, want %q", name, i, got, c.Decoded)
			}
		}
	}
}
