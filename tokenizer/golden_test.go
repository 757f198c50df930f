package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
)

// goldenDir returns $MANIFOLD_GOLDEN_DIR/tokenizers, or
// ../shared/golden/tokenizers relative to the module root.
func goldenDir(t testing.TB) string {
	t.Helper()
	base := os.Getenv("MANIFOLD_GOLDEN_DIR")
	if base == "" {
		dir, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				t.Skip("module root not found")
			}
			dir = parent
		}
		base = filepath.Join(dir, "..", "shared", "golden")
	}
	d := filepath.Join(base, "tokenizers")
	if _, err := os.Stat(filepath.Join(d, "golden.json")); err != nil {
		t.Skipf("no tokenizer fixtures: %v", err)
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
				if got := tk.Encode(c.Text, false); !slices.Equal(got, c.IDs) {
					t.Errorf("case %d %q: Encode(addSpecial=false)\n got %v\nwant %v", i, c.Text, got, c.IDs)
				}
				if got := tk.Encode(c.Text, true); !slices.Equal(got, c.IDsWithSpecial) {
					t.Errorf("case %d %q: Encode(addSpecial=true)\n got %v\nwant %v", i, c.Text, got, c.IDsWithSpecial)
				}
				if got := tk.Decode(c.IDs, false); got != c.Decoded {
					t.Errorf("case %d: Decode\n got %q\nwant %q", i, got, c.Decoded)
				}
			}
		})
	}
}
