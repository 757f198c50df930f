package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzTokenizerJSON builds a tokenizer from any tokenizer.json: it either
// fails with an error or gives a tokenizer that encodes, decodes (ids past
// its vocabulary included) and streams without panicking, failing only
// where a regex match runs past its time limit (checkTokenizerJSON).
//
// The seeds come from testdata/tiny's pipelines (Llama 2's SentencePiece
// BPE with byte fallback, Qwen3's and DeepSeek-V3's byte-level BPE with
// their split patterns), cut by smallSeeds into inputs of at most
// maxSeedBytes: each holds a small vocabulary and one stage of a pipeline.
// The fuzzer minimizes every input that finds new coverage, and that costs
// executions growing with the square of its length: with the whole 10-12 KB
// files as seeds it spent its minute minimizing (8 executions reported in
// 60 s); longer inputs are skipped. TestTinyTokenizers holds the whole files
// to the same rule.
func FuzzTokenizerJSON(f *testing.F) {
	files, _ := filepath.Glob("testdata/tiny/*.json")
	if len(files) == 0 {
		f.Fatal("no seeds in testdata/tiny")
	}
	seen := map[string]bool{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		seeds, err := smallSeeds(b)
		if err != nil {
			f.Fatalf("seeds of %s: %v", name, err)
		}
		for _, seed := range seeds {
			if _, err := FromJSON(seed, nil); err != nil {
				f.Fatalf("seed %s of %s: %v", seed, name, err)
			}
			if len(seed) > maxSeedBytes {
				f.Fatalf("seed %s of %s: %d bytes, over %d: the fuzzer would spend its time minimizing", seed, name, len(seed), maxSeedBytes)
			}
			if !seen[string(seed)] {
				seen[string(seed)] = true
				f.Add(seed)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > maxFuzzTokenizerJSON {
			return
		}
		checkTokenizerJSON(t, b)
	})
}

// TestTinyTokenizers holds testdata/tiny's whole files, once FuzzTokenizerJSON's
// seeds, to its rule.
func TestTinyTokenizers(t *testing.T) {
	files, _ := filepath.Glob("testdata/tiny/*.json")
	if len(files) == 0 {
		t.Fatal("no files in testdata/tiny")
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := FromJSON(b, nil); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Run(filepath.Base(name), func(t *testing.T) { checkTokenizerJSON(t, b) })
	}
}

// fuzzTexts are the texts checkTokenizerJSON encodes.
var fuzzTexts = []string{"", "Hello, world!", "  it's 123 ab\n\n\tc", "日本語 😀", "\xff\xfe", "<s>x</s><|im_start|>"}

// checkTokenizerJSON is FuzzTokenizerJSON's rule for one tokenizer.json.
func checkTokenizerJSON(t *testing.T, b []byte) {
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
	for _, s := range fuzzTexts {
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
}

// maxSeedBytes bounds FuzzTokenizerJSON's seeds, maxFuzzTokenizerJSON its
// inputs: longer ones only cost minimizing time.
const maxSeedBytes, maxFuzzTokenizerJSON = 640, 768

// seedText's characters make smallSeeds' vocabulary.
const seedText = "Hi 1\n"

// smallSeeds cuts a tokenizer.json into fuzzing seeds. Each holds the model
// with its vocabulary cut to the one-character tokens of seedText's
// characters (as they are, in byte-level form, as SentencePiece's ▁, or as
// byte-fallback tokens), the unknown token, and the tokens of up to 2 merges
// of them; the first added token; and one stage of the pipeline
// (normalizer, pre-tokenizer, post-processor or decoder), or, for a
// Sequence too long for a seed, one of its steps (in a Sequence of one).
// Fields at their defaults (null, false, "") are left out.
func smallSeeds(b []byte) ([][]byte, error) {
	var tj map[string]any
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, err
	}
	model, _ := tj["model"].(map[string]any)
	vocab, _ := model["vocab"].(map[string]any)
	if vocab == nil {
		return nil, errors.New("no model.vocab")
	}
	small := map[string]any{}
	add := func(tok string) {
		if id, ok := vocab[tok]; ok {
			small[tok] = id
		}
	}
	add("▁")
	if unk, ok := model["unk_token"].(string); ok {
		add(unk)
	}
	for _, r := range seedText {
		add(string(r))
	}
	for _, r := range bytesToByteLevel(seedText) {
		add(string(r))
	}
	for _, c := range []byte(seedText) {
		if _, ok := small[string(rune(c))]; !ok {
			add(fmt.Sprintf("<0x%02X>", c))
		}
	}
	var merges []any
	list, _ := model["merges"].([]any)
	for _, m := range list {
		var a, b string
		switch m := m.(type) {
		case string:
			a, b, _ = strings.Cut(m, " ")
		case []any:
			if len(m) == 2 {
				a, _ = m[0].(string)
				b, _ = m[1].(string)
			}
		}
		_, okA := small[a]
		_, okB := small[b]
		if id, ok := vocab[a+b]; ok && okA && okB && len(merges) < 2 {
			small[a+b] = id
			merges = append(merges, m)
		}
	}
	model["vocab"], model["merges"] = small, merges
	dropDefaults(model)
	base := map[string]any{"model": model}
	if added, ok := tj["added_tokens"].([]any); ok {
		added = added[:min(len(added), 1)]
		for _, a := range added {
			if a, ok := a.(map[string]any); ok {
				dropDefaults(a)
			}
		}
		base["added_tokens"] = added
	}
	seed := func(stage string, v any) ([]byte, error) {
		m := map[string]any{stage: v}
		for k, v := range base {
			m[k] = v
		}
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(m); err != nil {
			return nil, err
		}
		return bytes.TrimSpace(out.Bytes()), nil
	}
	var seeds [][]byte
	for _, stage := range []string{"normalizer", "pre_tokenizer", "post_processor", "decoder"} {
		v, ok := tj[stage].(map[string]any)
		if !ok {
			continue
		}
		whole, err := seed(stage, v)
		if err != nil {
			return nil, err
		}
		steps, isSeq := sequenceSteps(v)
		if len(whole) <= maxSeedBytes || !isSeq {
			seeds = append(seeds, whole)
			continue
		}
		for _, step := range steps {
			one := maps.Clone(v)
			for _, k := range []string{"normalizers", "pretokenizers", "decoders", "processors"} {
				if _, ok := one[k]; ok {
					one[k] = []any{step}
				}
			}
			s, err := seed(stage, one)
			if err != nil {
				return nil, err
			}
			seeds = append(seeds, s)
		}
	}
	return seeds, nil
}

// sequenceSteps returns the steps of a Sequence stage.
func sequenceSteps(v map[string]any) ([]any, bool) {
	if v["type"] != "Sequence" {
		return nil, false
	}
	for _, k := range []string{"normalizers", "pretokenizers", "decoders", "processors"} {
		if steps, ok := v[k].([]any); ok {
			return steps, true
		}
	}
	return nil, false
}

// dropDefaults removes the fields of m that hold null, false or "".
func dropDefaults(m map[string]any) {
	for k, v := range m {
		if v == nil || v == false || v == "" {
			delete(m, k)
		}
	}
}
