package tokenizer

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/dlclark/regexp2"
)

// benchCorpusBytes is how much text the encode benchmarks tokenize.
const benchCorpusBytes = 4 << 20

// benchCorpus returns documents totalling about benchCorpusBytes: the JSON
// list of strings named by $TOKENIZER_BENCH_CORPUS, or Go source files from
// GOROOT/src in lexical order (code, comments in English, some Unicode).
func benchCorpus(b *testing.B) []string {
	if p := os.Getenv("TOKENIZER_BENCH_CORPUS"); p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		var docs []string
		if err := json.Unmarshal(data, &docs); err != nil {
			b.Fatalf("%s: %v", p, err)
		}
		return docs
	}
	var docs []string
	total := 0
	root := filepath.Join(runtime.GOROOT(), "src")
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || total >= benchCorpusBytes {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err == nil {
			docs = append(docs, string(data))
			total += len(data)
		}
		return nil
	})
	if total == 0 {
		b.Skip("no Go sources under GOROOT")
	}
	return docs
}

func benchEncode(b *testing.B, tk *Tokenizer, docs []string) {
	n := 0
	for _, d := range docs {
		n += len(d)
	}
	b.SetBytes(int64(n))
	b.ResetTimer()
	tokens := 0
	for b.Loop() {
		tokens = 0
		for _, d := range docs {
			tokens += len(mustEncode(b, tk, d, false))
		}
	}
	b.ReportMetric(float64(tokens), "tokens")
}

// BenchmarkEncode measures single-threaded encode throughput per fixture
// tokenizer, with the pre-tokenizer scanners (scan), with regexp2 running
// the same patterns (regexp2), and with regexp2 without the time limit on
// each match (regexp2-nolimit), for the cost of that limit.
func BenchmarkEncode(b *testing.B) {
	dir, g := loadGolden(b)
	docs := benchCorpus(b)
	for _, name := range sortedKeys(g) {
		tk := fixtureTokenizer(b, dir, name)
		b.Run(name+"/scan", func(b *testing.B) { benchEncode(b, tk, docs) })
		tb, err := os.ReadFile(filepath.Join(dir, name, "tokenizer.json"))
		if err != nil {
			b.Fatal(err)
		}
		slow, err := build(tb, nil, buildOptions{scanners: false})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/regexp2", func(b *testing.B) { benchEncode(b, slow, docs) })
		nolimit, err := build(tb, nil, buildOptions{matchTimeout: regexp2.DefaultMatchTimeout})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"/regexp2-nolimit", func(b *testing.B) { benchEncode(b, nolimit, docs) })
	}
}

func BenchmarkDecode(b *testing.B) {
	dir, g := loadGolden(b)
	docs := benchCorpus(b)
	for _, name := range sortedKeys(g) {
		tk := fixtureTokenizer(b, dir, name)
		var ids [][]int
		n := 0
		for _, d := range docs {
			ids = append(ids, mustEncode(b, tk, d, false))
			n += len(d)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				for _, x := range ids {
					mustDecode(b, tk, x, false)
				}
			}
		})
	}
}
