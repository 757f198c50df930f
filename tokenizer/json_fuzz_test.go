package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzTokenizerJSON builds a tokenizer from any tokenizer.json: it either
// fails with an error or gives a tokenizer that encodes, decodes (ids past
// its vocabulary included) and streams without panicking, failing only
// where a regex match runs past its time limit. The seeds are
// testdata/tiny: the golden tokenizers' pipelines (Llama 2's SentencePiece
// BPE with byte fallback, Qwen3's and DeepSeek-V3's byte-level BPE with
// their split patterns) over their first 600 vocabulary entries.
func FuzzTokenizerJSON(f *testing.F) {
	files, _ := filepath.Glob("testdata/tiny/*.json")
	if len(files) == 0 {
		f.Fatal("no seeds in testdata/tiny")
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		if _, err := FromJSON(b, nil); err != nil {
			f.Fatalf("seed %s: %v", name, err)
		}
		f.Add(b)
	}
	texts := []string{"", "Hello, world!", "  it's 123 ab\n\n\tc", "日本語 😀", "\xff\xfe", "<s>x</s><|im_start|>"}
	f.Fuzz(func(t *testing.T, b []byte) {
		// build is FromJSON with a short match time limit, so that a
		// pathological regex costs an input a tenth of a second or two
		// (regexp2's clock ticks every 100 ms), not seconds.
		tk, err := build(b, nil, buildOptions{scanners: true, matchTimeout: 10 * time.Millisecond})
		if err != nil {
			return
		}
		// The only error is a regex match past its time limit.
		check := func(err error) {
			t.Helper()
			var pe *patternError
			if err != nil && !errors.As(err, &pe) {
				t.Fatal(err)
			}
		}
		for _, s := range texts {
			for _, special := range []bool{false, true} {
				ids, err := tk.Encode(s, special)
				check(err)
				_, err = tk.Decode(ids, false)
				check(err)
				_, err = tk.Decode(ids, true)
				check(err)
				sd := tk.NewStreamDecoder()
				for _, id := range ids {
					_, err = sd.Add(id)
					check(err)
				}
				_, err = sd.Flush()
				check(err)
			}
		}
		_, err = tk.Decode([]int{-1, 0, 1, 1 << 30}, false)
		check(err)
		sd := tk.NewStreamDecoder()
		_, err = sd.Add(-1)
		check(err)
		_, err = sd.Add(1 << 30)
		check(err)
	})
}
