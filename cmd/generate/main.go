// Command generate runs a model folder on a prompt and streams the result.
//
//	go run ./cmd/generate -prompt "func main() {"
//	go run ./cmd/generate -model DIR -prompt TEXT [-chat] [-max-tokens N] [sampling flags]
//	go run ./cmd/generate -model DIR -ids 1,2,3 ...
//	    [-attention dense|htree [-htree-topk K] [-htree-rate R] [-htree-dense N] [-htree-first-layer L]]
//
// Without -model it runs the built-in model (internal/defaultmodel: a small
// DeepSeek-V4 that writes Go, extracted to the user cache on first use).
// With a tokenizer.json in the model folder the output is text; without one,
// the prompt must be given as ids and the output is ids.
//
// Load time, prompt and decode tokens/s and the device go to stderr; the
// generated tokens go to stdout as they are produced. Ctrl-C stops cleanly.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/defaultmodel"
	"github.com/manifoldlm/manifold/model"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		os.Exit(1)
	}
}

type options struct {
	model, ids, device  string
	prompt              string
	chat                bool
	maxTokens, ctx      int
	threads             int
	sampling            engine.SamplingOptions
	seed                int64
	ignoreEOS, quietLog bool
	stops               []string
	attention           model.AttentionOptions
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.StringVar(&o.model, "model", "", "model folder (config.json, *.safetensors); empty: the built-in Go model")
	fs.StringVar(&o.prompt, "prompt", "", "prompt text (needs the model's tokenizer.json)")
	fs.BoolVar(&o.chat, "chat", false, "render -prompt as a user message through the model's chat template")
	fs.StringVar(&o.ids, "ids", "", "prompt as comma-separated token ids (instead of -prompt)")
	fs.StringVar(&o.device, "device", "auto", "auto, cpu or cuda")
	fs.IntVar(&o.maxTokens, "max-tokens", 64, "tokens to generate at most (0: until EOS or the context is full)")
	fs.IntVar(&o.ctx, "ctx", 0, "context length in tokens (0: the model's, at most 4096)")
	fs.IntVar(&o.threads, "threads", 0, "CPU threads (0: all cores)")
	fs.Float64Var(&o.sampling.Temperature, "temperature", 0.7, "sampling temperature (0: greedy)")
	fs.IntVar(&o.sampling.TopK, "top-k", 40, "keep the K most likely tokens (0: off)")
	fs.Float64Var(&o.sampling.TopP, "top-p", 0.95, "nucleus sampling threshold (1: off)")
	fs.Float64Var(&o.sampling.MinP, "min-p", 0.05, "drop tokens below this share of the best one's probability (0: off)")
	fs.Float64Var(&o.sampling.RepetitionPenalty, "repeat-penalty", 1.0, "repetition penalty (1: off)")
	fs.Int64Var(&o.seed, "seed", -1, "random seed (-1: random)")
	fs.BoolVar(&o.ignoreEOS, "ignore-eos", false, "do not stop at the model's end-of-sequence tokens")
	fs.Func("stop", "stop when the text contains this string (repeatable; \\n, \\t and \\\\ are escapes; needs the model's tokenizer)", func(v string) error {
		v = stopEscapes.Replace(v)
		if v == "" {
			return errors.New("empty stop string")
		}
		o.stops = append(o.stops, v)
		return nil
	})
	fs.StringVar(&o.attention.Kind, "attention", "dense", "dense or htree (hierarchical sparse attention, Llama/Qwen3; docs/htree.md)")
	fs.IntVar(&o.attention.HTree.TopK, "htree-topk", 0, "htree: nodes expanded per level (0: 512)")
	fs.IntVar(&o.attention.HTree.Rate, "htree-rate", 0, "htree: children per tree node (0: 16)")
	fs.IntVar(&o.attention.HTree.TopCandidates, "htree-dense", 0, "htree: positions below this attend exactly, the top-level candidate bound (0: topk*rate)")
	fs.IntVar(&o.attention.FirstLayer, "htree-first-layer", 0, "htree: layers before this one stay dense")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if (o.ids == "") == (o.prompt == "") {
		return nil, errors.New("give the prompt as text (-prompt TEXT) or as token ids (-ids 1,2,3), one of the two")
	}
	if o.maxTokens < 0 {
		return nil, fmt.Errorf("-max-tokens %d: want >= 0 (0: until EOS or the context is full)", o.maxTokens)
	}
	if err := o.sampling.Validate(); err != nil { // before the model loads
		return nil, err
	}
	if o.seed >= 0 {
		o.sampling.Seed = uint64(o.seed)
	} else {
		o.sampling.Seed = uint64(randomSeed())
	}
	return o, nil
}

// stopEscapes turns the escapes a -stop value may hold into the characters.
var stopEscapes = strings.NewReplacer(`\\`, `\`, `\n`, "\n", `\t`, "\t")

func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("-ids: %q is not a token id", f)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.model == "" {
		if o.model, err = defaultmodel.Dir(); err != nil {
			return err
		}
	}
	m, err := engine.Load(o.model, engine.Options{Device: o.device, Threads: o.threads, ContextLength: o.ctx, Attention: o.attention})
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Fprintf(stderr, "loaded %s (%s) in %.2fs on %s\n", o.model, m.Config().ModelType, m.LoadTime().Seconds(), m.Device())
	var prompt []int
	if o.prompt != "" {
		prompt, err = m.Encode(o.prompt, o.chat)
	} else {
		prompt, err = parseIDs(o.ids)
	}
	if err != nil {
		return err
	}
	asText := m.Tokenizer() != nil

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	s, err := m.NewSession(0)
	if err != nil {
		return err
	}
	if len(o.stops) > 0 && !asText {
		return fmt.Errorf("-stop: %s has no tokenizer.json, so its output is token ids, not text", o.model)
	}
	opts := engine.GenerateOptions{MaxTokens: o.maxTokens, Sampling: o.sampling, StopStrings: o.stops}
	if o.ignoreEOS {
		opts.StopTokens = []int{}
	}
	res, err := s.Generate(ctx, prompt, opts, func(t engine.Token) error {
		if asText {
			_, err := io.WriteString(stdout, t.Text)
			return err
		}
		sep := " "
		if t.Index == 0 {
			sep = ""
		}
		_, err := fmt.Fprintf(stdout, "%s%d", sep, t.ID)
		return err
	})
	fmt.Fprintln(stdout)
	if res != nil && res.PromptDuration > 0 {
		fmt.Fprintf(stderr, "prompt: %d tokens, %.1f tokens/s; decode: %d tokens, %.1f tokens/s (%s)\n",
			res.PromptTokens, res.PromptTokensPerSecond(), len(res.Tokens), res.DecodeTokensPerSecond(), res.Reason)
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(stderr, "interrupted")
		return nil
	}
	return err
}

// randomSeed is the seed used when -seed is negative.
func randomSeed() int64 { return time.Now().UnixNano() & (1<<62 - 1) }
