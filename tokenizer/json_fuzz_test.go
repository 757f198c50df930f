package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzTokenizerJSON builds a tokenizer from any tokenizer.json: it either
// fails with an error or gives a tokenizer that encodes, decodes (ids past
// its vocabulary included) and streams without panicking. The seeds are
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
		tk, err := FromJSON(b, nil)
		if err != nil {
			return
		}
		for _, s := range texts {
			for _, special := range []bool{false, true} {
				ids := tk.Encode(s, special)
				tk.Decode(ids, false)
				tk.Decode(ids, true)
				sd := tk.NewStreamDecoder()
				for _, id := range ids {
					sd.Add(id)
				}
			}
		}
		tk.Decode([]int{-1, 0, 1, 1 << 30}, false)
		sd := tk.NewStreamDecoder()
		sd.Add(-1)
		sd.Add(1 << 30)
	})
}
