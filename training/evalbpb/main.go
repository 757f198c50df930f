// Command evalbpb measures a model's validation bits per byte on the
// held-out Go packages, as the engine runs it (CPU backend, float32 compute).
//
//	go run ./training/prepare                # writes .train/val.txt
//	go run ./training/evalbpb [-data .train/val.txt] [-windows N] [-seq 512] [-ids FILE] [MODEL_DIR ...]
//
// With no MODEL_DIR it evaluates the bf16 checkpoint of the built-in model
// (internal/defaultmodel/testdata/bf16) and the embedded NVFP4 model.
//
// The definition is training/train.py's: the validation text (each file
// preceded by <|endoftext|>) is tokenized as one stream, cut into
// non-overlapping windows of -seq tokens (the last may be shorter), and each
// window runs from an empty cache; every token but a window's first is
// predicted. bits per byte = Σ -ln p(token) / Σ bytes(token) / ln 2 over the
// predicted tokens, where bytes(token) is the length of the token's UTF-8
// bytes (0 for the special token). -windows N keeps the first N windows
// (train.py also reports its figure for the first 64). -ids compares the
// token stream with the one train.py tokenized (its val_ids.safetensors).
//
// The tokenizer must be byte-level BPE (each character of a vocabulary
// entry is one byte), as the built-in model's is; the command checks that
// the token bytes add up to the text's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/defaultmodel"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/tokenizer"
	"github.com/manifoldlm/manifold/weights"
)

const separator = "<|endoftext|>"

type options struct {
	data    string
	windows int
	seq     int
	ids     string
	threads int
}

func main() {
	var o options
	flag.StringVar(&o.data, "data", filepath.Join(".train", "val.txt"), "validation text written by training/prepare")
	flag.IntVar(&o.windows, "windows", 0, "evaluate only the first N windows (0: all)")
	flag.IntVar(&o.seq, "seq", 512, "window length in tokens (train.py's --seq)")
	flag.StringVar(&o.ids, "ids", "", "val_ids.safetensors from train.py: check the tokenization against it")
	flag.IntVar(&o.threads, "threads", 0, "CPU threads (0: all cores)")
	flag.Parse()
	dirs := flag.Args()
	if err := run(o, dirs); err != nil {
		fmt.Fprintln(os.Stderr, "evalbpb:", err)
		os.Exit(1)
	}
}

func run(o options, dirs []string) error {
	if o.seq < 2 {
		return fmt.Errorf("-seq %d: want at least 2", o.seq)
	}
	raw, err := os.ReadFile(o.data)
	if err != nil {
		return fmt.Errorf("%w (run `go run ./training/prepare` first)", err)
	}
	text := string(raw)
	if !strings.HasPrefix(text, separator) {
		return fmt.Errorf("%s does not start with %s", o.data, separator)
	}
	textBytes := len(text) - strings.Count(text, separator)*len(separator)

	if len(dirs) == 0 {
		def, err := defaultmodel.Dir()
		if err != nil {
			return err
		}
		dirs = []string{filepath.Join("internal", "defaultmodel", "testdata", "bf16"), def}
	}
	for _, dir := range dirs {
		if err := evalModel(o, dir, text, textBytes); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

func evalModel(o options, dir, text string, textBytes int) error {
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return err
	}
	f, m, err := model.Open(dir, cpu.New(o.threads), model.Options{})
	if err != nil {
		return err
	}
	defer f.Close()

	ids, err := tok.Encode(text, false)
	if err != nil {
		return err
	}
	blen := make([]float64, tok.VocabSize())
	for id := range blen {
		if s, ok := tok.Token(id); ok && !tok.IsSpecial(id) {
			blen[id] = float64(utf8.RuneCountInString(s))
		}
	}
	var sum float64
	for _, id := range ids {
		sum += blen[id]
	}
	if int(sum) != textBytes {
		return fmt.Errorf("token bytes add up to %d, the text has %d: not a byte-level BPE tokenizer?", int(sum), textBytes)
	}
	if o.ids != "" {
		if err := checkIDs(o.ids, ids); err != nil {
			return err
		}
	}

	n := (len(ids) + o.seq - 1) / o.seq
	if o.windows > 0 {
		n = min(n, o.windows)
	}
	st, err := m.NewState(o.seq)
	if err != nil {
		return err
	}
	V := m.Config().VocabSize
	start := time.Now()
	var nats, nbytes float64
	windows, tokens := 0, 0
	for w := range n {
		win := ids[w*o.seq : min((w+1)*o.seq, len(ids))]
		if len(win) < 2 {
			continue
		}
		in := make([]int32, len(win))
		for i, t := range win {
			in[i] = int32(t)
		}
		st.Truncate(0)
		logits, err := m.Forward(context.Background(), st, in, true)
		if err != nil {
			return err
		}
		for p := 0; p+1 < len(win); p++ {
			z := logits[p*V : (p+1)*V]
			nats += layers.LogSumExp(z) - float64(z[win[p+1]]) // -log softmax(z)[next]
			nbytes += blen[win[p+1]]
		}
		windows++
		tokens += len(win)
	}
	if nbytes == 0 {
		return errors.New("no predicted bytes")
	}
	el := time.Since(start)
	fmt.Printf("%s: %.4f bits per byte over %d windows of %d tokens (%d tokens, %.0f predicted bytes, %.0f nats) in %.1fs (%.0f tokens/s)\n",
		dir, nats/nbytes/math.Ln2, windows, o.seq, tokens, nbytes, nats, el.Seconds(), float64(tokens)/el.Seconds())
	return nil
}

func checkIDs(path string, ids []int) error {
	ck, err := weights.Open(path)
	if err != nil {
		return err
	}
	defer ck.Close()
	tn, err := ck.Tensor("val_ids")
	if err != nil {
		return err
	}
	want, err := tn.Int64s()
	if err != nil {
		return err
	}
	if len(want) != len(ids) {
		return fmt.Errorf("%d tokens, %s has %d", len(ids), path, len(want))
	}
	for i := range ids {
		if int64(ids[i]) != want[i] {
			return fmt.Errorf("token %d is %d, %s has %d", i, ids[i], path, want[i])
		}
	}
	fmt.Printf("tokenization equals %s (%d tokens)\n", path, len(ids))
	return nil
}
