package tokenizer_test

import (
	"fmt"

	"github.com/manifoldlm/manifold/tokenizer"
)

// Encode text to token ids and decode them back. A model folder's
// tokenizer.json (and tokenizer_config.json, for the special tokens and the
// chat template) load with tokenizer.Load(dir); this one is a cut-down Qwen3
// pipeline.
func Example() {
	tok, err := tokenizer.FromFiles("testdata/tiny/qwen3.json", "")
	if err != nil {
		fmt.Println(err)
		return
	}
	ids, err := tok.Encode("hello world", false)
	if err != nil { // only a tokenizer.json regex that backtracks without end fails
		fmt.Println(err)
		return
	}
	text, err := tok.Decode(ids, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(ids) > 0, text)
	// Output: true hello world
}
