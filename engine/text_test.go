package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/tokenizer"
	"github.com/manifoldlm/manifold/weights"
)

// modelWithTokenizer writes a tiny random Llama whose vocabulary fits the
// fixture tokenizer name, with that tokenizer's files beside it.
func modelWithTokenizer(t *testing.T, name string) (string, *tokenizer.Tokenizer) {
	src := golden.Path(t, "tokenizers", name)
	tok, err := tokenizer.Load(src)
	if err != nil {
		t.Skipf("tokenizer %s: %v", name, err)
	}
	spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 32, Heads: 2, KVHeads: 1, Vocab: tok.VocabSize(), DType: weights.BF16, Seed: 5}
	dir := testmodel.WriteTemp(t, spec)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if data, err := os.ReadFile(filepath.Join(src, f)); err == nil {
			os.WriteFile(filepath.Join(dir, f), data, 0o644)
		}
	}
	return dir, tok
}

func TestTextInTextOut(t *testing.T) {
	for _, name := range []string{"llama2", "qwen3"} {
		t.Run(name, func(t *testing.T) {
			dir, tok := modelWithTokenizer(t, name)
			m, s := openSession(t, dir, Options{Device: "cpu", ContextLength: 256})
			ids, err := m.Encode("Hello, world", false)
			if err != nil {
				t.Fatal(err)
			}
			want, err := tok.Encode("Hello, world", true)
			if err != nil {
				t.Fatal(err)
			}
			if bos, ok := tok.BOS(); ok && tok.AddBOSToken() && want[0] != bos {
				want = append([]int{bos}, want...)
			}
			if !slices.Equal(ids, want) {
				t.Errorf("Encode = %v, want %v", ids, want)
			}
			var streamed strings.Builder
			res, err := s.Generate(context.Background(), ids, GenerateOptions{MaxTokens: 12, StopTokens: []int{},
				Sampling: SamplingOptions{Temperature: 1, Seed: 3}}, func(t Token) error {
				streamed.WriteString(t.Text)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			full := newText(t, m, ids, res.Tokens)
			// The streamed text holds back only an unfinished character at
			// the end; its first token keeps the space a decoder (Llama 2's
			// Metaspace) drops at the start of a text.
			if !strings.HasPrefix(full, streamed.String()) || len(full)-streamed.Len() > 4 {
				t.Errorf("streamed %q, decoded %q", streamed.String(), full)
			}
			plain, perr := tok.Encode("Hi", false)
			if perr != nil {
				t.Fatal(perr)
			}
			chat, err := m.Encode("Hi", true)
			switch {
			case tok.HasChatTemplate() && err != nil:
				t.Errorf("chat: %v", err)
			case !tok.HasChatTemplate() && !errors.Is(err, tokenizer.ErrNoChatTemplate):
				t.Errorf("chat without a template: %v", err)
			case err == nil && len(chat) <= len(plain):
				t.Errorf("chat prompt %v adds no template tokens", chat)
			}
		})
	}
}

func TestTokenizerModelMismatch(t *testing.T) {
	dir, _ := modelWithTokenizer(t, "llama2")
	data, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(strings.Replace(string(data), `"vocab_size": 32000`, `"vocab_size": 100`, 1)), 0o644)
	if _, err := Load(dir, Options{Device: "cpu"}); err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Errorf("mismatched tokenizer: %v", err)
	}
	m, _ := loadGolden(t, "llama")
	if _, err := m.Encode("hi", false); !errors.Is(err, ErrNoTokenizer) {
		t.Errorf("no tokenizer: %v", err)
	}
}

// TestGenerateTextError: a tokenizer.json decoder regex that backtracks
// without end on the generated text (after Fuse, `(a+)+b` over a run of a's
// with no b) ends Generate with an error naming the pattern once the match
// passes its time limit (1 s), with the tokens generated so far, instead of
// hanging.
func TestGenerateTextError(t *testing.T) {
	m := tinyTextModel(t, 5, func(i int) string { return strings.Repeat("a", 40+i) }, // every token a run of at least 40 a's
		`{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"Regex":"(a+)+b"},"content":"x"}]}`)
	s, err := m.NewSession(64)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Generate(context.Background(), []int{1, 2, 3}, GenerateOptions{MaxTokens: 4, StopTokens: []int{}}, nil)
	if err == nil || !strings.Contains(err.Error(), `Replace pattern "(a+)+b"`) || !strings.Contains(err.Error(), "text of token") {
		t.Fatalf("error %v, want the decoder pattern's time limit", err)
	}
	if res == nil || len(res.Tokens) == 0 {
		t.Errorf("result %+v: want the tokens generated so far", res)
	}
}

// tinyTextModel loads, on the CPU, a one-layer Llama of 64 tokens (weights
// from seed) whose tokenizer.json names token i text(i) and decodes with
// decoder (a tokenizer.json decoder object); closed when the test ends.
func tinyTextModel(t *testing.T, seed uint64, text func(i int) string, decoder string) *Model {
	t.Helper()
	dir := t.TempDir()
	const vocab = 64
	spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 32, Heads: 2, KVHeads: 1, Vocab: vocab, DType: weights.BF16, Seed: seed}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	var v strings.Builder
	for i := range vocab {
		if i > 0 {
			v.WriteByte(',')
		}
		fmt.Fprintf(&v, "%q:%d", text(i), i)
	}
	tj := `{"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":` + decoder + `,
		"model":{"type":"BPE","vocab":{` + v.String() + `},"merges":[]}}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tj), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir, Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// newText is the text tokens add after prompt: the decode of both less the
// decode of the prompt, as the engine streams it.
func newText(t *testing.T, m *Model, prompt, tokens []int) string {
	t.Helper()
	before, err := m.Decode(prompt)
	if err != nil {
		t.Fatal(err)
	}
	all, err := m.Decode(slices.Concat(prompt, tokens))
	if err != nil {
		t.Fatal(err)
	}
	after, ok := strings.CutPrefix(all, before)
	if !ok {
		t.Fatalf("the decode of prompt and tokens %q does not start with the prompt's %q", all, before)
	}
	return after
}
