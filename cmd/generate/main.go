// Command generate runs a model folder on a prompt and streams the result.
//
//	go run ./cmd/generate -prompt "func main() {"
//	go run ./cmd/generate -model DIR -prompt TEXT [-chat] [-max-tokens N] [sampling flags]
//	go run ./cmd/generate -model DIR -ids 1,2,3 ...
//	    [-attention dense|htree[:rate=R,topk=K,dense=N,first-layer=L]]
//
// Without -model it runs the built-in model (internal/defaultmodel: a small
// DeepSeek-V4 that writes Go, extracted to the user cache on first use).
// With a tokenizer.json in the model folder the output is text; without one,
// the prompt must be given as ids and the output is ids.
//
// stdout is the whole text: the prompt (unless -echo=false or -chat, whose
// output is a reply rather than a continuation), then the generated tokens as
// they are produced. Load time, prompt and decode tokens/s, the device, and the
// seed when none was given go to stderr.
//
// The arguments are checked before the weights load: flag syntax, -ids, the
// -attention spec, and against the folder's config.json and tokenizer files
// -stop and -prompt without a tokenizer, -chat without a chat template,
// htree on an architecture without it, and a -ctx past the model's context
// (max_position_embeddings, or what its YaRN or linear RoPE scaling extends
// it to), which is an error: positions past it were never trained.
//
// Exit status: 0 done (also for -h), 1 failed, 2 bad arguments, 130
// interrupted (SIGINT, Ctrl-C, during generation: the tokens so far and the
// rates are written, then "interrupted"; during loading the signal ends the
// process at once).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/defaultmodel"
	"github.com/manifoldlm/manifold/model"
)

func main() {
	os.Exit(exitCode(run(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// Exit statuses.
const (
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, what shells report for a process Ctrl-C ended
)

// errInterrupted is run's error when SIGINT stopped generation.
var errInterrupted = errors.New("interrupted")

// usageError is a mistake in the arguments (exit status 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// exitCode reports err on stderr and returns the process's exit status.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errInterrupted):
		fmt.Fprintln(stderr, "generate: interrupted")
		return exitInterrupted
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "generate: %v\n(generate -h shows the flags and examples)\n", err)
		return exitUsage
	}
	fmt.Fprintln(stderr, "generate:", err)
	return exitFailed
}

const synopsis = `usage: generate [-model DIR] (-prompt TEXT [-chat] | -ids 1,2,3) [flags]

Runs a model on a prompt and streams the continuation to stdout; load time,
tokens/s, the device and the seed go to stderr. Without -model it runs the
built-in model, a small DeepSeek-V4 that writes Go.

Examples:
  generate -prompt "func main() {"                       the built-in model
  generate -prompt "func main() {" -seed 7               the same tokens on every run
  generate -prompt "package sort" -temperature 0         greedy
  generate -model DIR -prompt "Write a haiku about Go." -chat
  generate -model DIR -ids 1,2,3 -max-tokens 16          a folder without tokenizer.json
  generate -model DIR -prompt TEXT -attention htree:topk=256,first-layer=2
  generate -model DIR -prompt TEXT -stop '\n\n' -echo=false

Flags:
`

const exitStatuses = `
Exit status: 0 done, 1 failed, 2 bad arguments, 130 interrupted (Ctrl-C).
`

type options struct {
	model, device     string
	prompt            string
	promptSet, idsSet bool
	ids               []int
	chat              bool
	echo              bool
	maxTokens, ctx    int
	threads           int
	sampling          engine.SamplingOptions
	seed              int64
	ignoreEOS         bool
	stops             []string
	attention         model.AttentionOptions
	draft             int // -draft: tokens drafted a step (0: off)
	experts           model.ExpertPlacement
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.StringVar(&o.model, "model", "", "model folder (config.json, *.safetensors); empty: the built-in Go model")
	fs.StringVar(&o.prompt, "prompt", "", "prompt text (needs the model's tokenizer.json)")
	fs.BoolVar(&o.chat, "chat", false, "render -prompt as a user message through the model's chat template")
	fs.Func("ids", "prompt as comma-separated token `ids` (instead of -prompt)", func(v string) (err error) {
		o.ids, err = parseIDs(v)
		return err
	})
	fs.BoolVar(&o.echo, "echo", true, "write the prompt to stdout before the generated text, so stdout is the whole text (not with -chat)")
	fs.StringVar(&o.device, "device", "auto", "auto, cpu or cuda")
	fs.IntVar(&o.maxTokens, "max-tokens", 64, "tokens to generate at most (0: until EOS or the context is full)")
	fs.IntVar(&o.ctx, "ctx", 0, "context length in tokens, at most the model's max_position_embeddings (0: the model's, at most 4096)")
	fs.IntVar(&o.threads, "threads", 0, "CPU threads (0: all cores)")
	fs.IntVar(&o.draft, "draft", 0, "speculative decoding: tokens drafted a step with the model's MTP block (DeepSeek-V4 mtp.0; 0: off, at most 8)")
	fs.Float64Var(&o.sampling.Temperature, "temperature", 0.7, "sampling temperature (0: greedy)")
	fs.IntVar(&o.sampling.TopK, "top-k", 40, "keep the K most likely tokens (0: off)")
	fs.Float64Var(&o.sampling.TopP, "top-p", 0.95, "nucleus sampling threshold (1: off)")
	fs.Float64Var(&o.sampling.MinP, "min-p", 0.05, "drop tokens below this share of the best one's probability (0: off)")
	fs.Float64Var(&o.sampling.RepetitionPenalty, "repeat-penalty", 1.0, "repetition penalty (1: off)")
	fs.Int64Var(&o.seed, "seed", -1, "random seed (-1: pick one and print it to stderr)")
	fs.BoolVar(&o.ignoreEOS, "ignore-eos", false, "do not stop at the model's end-of-sequence tokens")
	fs.Func("stop", "stop when the text contains this `string` (repeatable; \\n, \\t and \\\\ are escapes; needs the model's tokenizer)", func(v string) error {
		v = stopEscapes.Replace(v)
		if v == "" {
			return errors.New("empty stop string")
		}
		o.stops = append(o.stops, v)
		return nil
	})
	o.attention.Kind = "dense"
	fs.Func("attention", "`kind` of attention: dense (the default) or htree, hierarchical sparse attention for Llama and Qwen3 (docs/htree.md),\n"+
		"optionally with parameters, htree:rate=R,topk=K,dense=N,first-layer=L (each 0 or absent: its default):\n"+
		"rate: children per tree node (16); topk: nodes expanded per level (512);\n"+
		"dense: positions below N attend exactly (topk*rate); first-layer: layers before L stay dense (0)",
		func(v string) (err error) {
			o.attention, err = parseAttention(v)
			return err
		})
	fs.Func("experts", "where DeepSeek-V4's routed experts live: auto (from the GPU's free memory), device, host,\n"+
		"a count of experts on the device, or a budget of device memory for them (40GiB, 500MiB); host experts run on the CPU",
		func(v string) (err error) {
			o.experts, err = parseExperts(v)
			return err
		})
	return fs
}

// parseExperts reads -experts: a mode, a count, or a budget in GiB or MiB.
func parseExperts(v string) (model.ExpertPlacement, error) {
	switch v {
	case "auto", "device", "host":
		return model.ExpertPlacement{Mode: v}, nil
	}
	for _, u := range []struct {
		suffix string
		scale  float64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil || f < 0 {
				return model.ExpertPlacement{}, fmt.Errorf("-experts %q: want a non-negative budget such as 40GiB", v)
			}
			return model.ExpertPlacement{Mode: "budget", Budget: int64(f * u.scale)}, nil
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return model.ExpertPlacement{}, fmt.Errorf("-experts %q: want auto, device, host, a count of experts or a budget such as 40GiB", v)
	}
	return model.ExpertPlacement{Mode: "count", Count: n}, nil
}

// parseFlags reads the arguments and checks what needs no model folder. A
// nil options and nil error mean -h: the usage went to stdout.
func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	fs.SetOutput(io.Discard) // errors are returned; -h prints the usage below
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			writeUsage(stdout)
			return nil, nil
		}
		return nil, &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		// The flag package stops at the first argument that is not a flag:
		// most often the second word of an unquoted prompt.
		hint := "quote a value with spaces"
		switch {
		case o.prompt != "":
			hint = fmt.Sprintf("quote a prompt with spaces: -prompt %q", o.prompt+" "+strings.Join(fs.Args(), " "))
		case o.ids != nil:
			hint = "-ids takes one list, without spaces: -ids 1,2,3"
		}
		return nil, usagef("unexpected argument %q: every argument is a flag or its value (%s)", fs.Arg(0), hint)
	}
	echoSet := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "prompt":
			o.promptSet = true
		case "ids":
			o.idsSet = true
		case "echo":
			echoSet = true
		}
	})
	switch {
	case o.promptSet && o.idsSet:
		return nil, usagef("give the prompt as text (-prompt TEXT) or as token ids (-ids 1,2,3), one of the two")
	case !o.promptSet && !o.idsSet:
		return nil, usagef("no prompt: give it as text (-prompt TEXT) or as token ids (-ids 1,2,3)")
	case o.promptSet && o.prompt == "" && !o.chat:
		return nil, usagef("the prompt is empty: -prompt needs some text to continue")
	case o.idsSet && len(o.ids) == 0:
		return nil, usagef("-ids is empty: give the prompt's token ids, comma-separated (-ids 1,2,3)")
	case o.chat && o.idsSet:
		return nil, usagef("-chat renders -prompt's text through the chat template; with -ids the prompt is already tokens")
	case o.chat && echoSet && o.echo:
		return nil, usagef("-echo with -chat: the output is the reply to the message, not a continuation of it; leave -echo out")
	}
	if o.chat {
		o.echo = false
	}
	if o.maxTokens < 0 {
		return nil, usagef("-max-tokens %d: want >= 0 (0: until EOS or the context is full)", o.maxTokens)
	}
	if o.ctx < 0 {
		return nil, usagef("-ctx %d: want >= 0 (0: the model's context, at most %d)", o.ctx, engine.DefaultContext)
	}
	if o.threads < 0 {
		return nil, usagef("-threads %d: want >= 0 (0: all cores)", o.threads)
	}
	switch o.device {
	case "auto", "cpu", "cuda":
	default:
		return nil, usagef("-device %q: want auto, cpu or cuda", o.device)
	}
	if err := o.sampling.Validate(); err != nil {
		return nil, &usageError{err.Error()}
	}
	if o.seed < -1 {
		return nil, usagef("-seed %d: want >= 0, or -1 for a random one", o.seed)
	}
	return o, nil
}

func writeUsage(w io.Writer) {
	fs := newFlagSet(&options{})
	fs.SetOutput(w)
	io.WriteString(w, synopsis)
	fs.PrintDefaults()
	io.WriteString(w, exitStatuses)
}

// stopEscapes turns the escapes a -stop value may hold into the characters.
var stopEscapes = strings.NewReplacer(`\\`, `\`, `\n`, "\n", `\t`, "\t")

func parseIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil // the empty prompt has its own message
	}
	var ids []int
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%q is not a token id (want comma-separated integers >= 0: -ids 1,2,3)", f)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// parseAttention reads an -attention spec: dense, htree, or
// htree:key=value,... with the keys rate, topk, dense and first-layer
// (model.AttentionOptions; 0 or absent: the default).
func parseAttention(s string) (model.AttentionOptions, error) {
	kind, params, hasParams := strings.Cut(s, ":")
	a := model.AttentionOptions{Kind: kind}
	switch kind {
	case "dense":
		if hasParams {
			return a, fmt.Errorf("dense attention takes no parameters (%q)", params)
		}
		return a, nil
	case "htree":
	default:
		return a, fmt.Errorf("%q: want dense or htree[:rate=R,topk=K,dense=N,first-layer=L]", s)
	}
	if !hasParams {
		return a, nil
	}
	seen := map[string]bool{}
	fields := map[string]*int{"rate": &a.HTree.Rate, "topk": &a.HTree.TopK, "dense": &a.HTree.TopCandidates, "first-layer": &a.FirstLayer}
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if !ok || err != nil || n < 0 {
			return a, fmt.Errorf("htree parameter %q: want key=N with N >= 0 (rate=16,topk=512,dense=8192,first-layer=0)", kv)
		}
		if seen[k] {
			return a, fmt.Errorf("htree parameter %s given twice", k)
		}
		seen[k] = true
		f := fields[k]
		if f == nil {
			return a, fmt.Errorf("htree parameter %q: the parameters are rate, topk, dense and first-layer", k)
		}
		*f = n
	}
	if err := a.HTree.WithDefaults().Validate(); err != nil {
		return a, err
	}
	return a, nil
}

// htreeArchitectures are the model types that run htree attention (the
// others' constructors refuse it: model/deepseek_v32.go, deepseek_v4.go).
var htreeArchitectures = map[string]bool{"llama": true, "qwen3": true}

// checkFolder checks the arguments against the model folder's config.json
// and tokenizer files, before any weight loads.
func checkFolder(o *options) error {
	if fi, err := os.Stat(o.model); err != nil {
		return fmt.Errorf("model folder: %w", err)
	} else if !fi.IsDir() {
		return usagef("-model %s is a file: give the model's folder (config.json, *.safetensors)", o.model)
	}
	cfg, err := model.LoadConfig(o.model)
	if err != nil {
		return err
	}
	if o.attention.Kind == "htree" {
		if !htreeArchitectures[cfg.ModelType] {
			return usagef("-attention htree: %s is a %s model; htree runs on llama and qwen3", o.model, cfg.ModelType)
		}
		if o.attention.FirstLayer >= cfg.NumLayers {
			return usagef("-attention htree:first-layer=%d: the model has layers 0..%d", o.attention.FirstLayer, cfg.NumLayers-1)
		}
	}
	if limit, why := contextLimit(cfg); limit > 0 && o.ctx > limit {
		return usagef("-ctx %d: the model's context is %d positions (%s); positions past it were never trained", o.ctx, limit, why)
	}
	for _, id := range o.ids {
		if id >= cfg.VocabSize {
			return usagef("-ids: token id %d: the vocabulary has ids 0..%d", id, cfg.VocabSize-1)
		}
	}
	hasTokenizer := exists(filepath.Join(o.model, "tokenizer.json"))
	switch {
	case o.promptSet && !hasTokenizer:
		return usagef("-prompt: %s has no tokenizer.json, so it takes token ids: -ids 1,2,3", o.model)
	case len(o.stops) > 0 && !hasTokenizer:
		return usagef("-stop: %s has no tokenizer.json, so its output is token ids, not text", o.model)
	case o.chat && !hasChatTemplate(o.model):
		return usagef("-chat: %s has no chat template (tokenizer_config.json's chat_template or chat_template.jinja): leave -chat out to continue the text", o.model)
	}
	return nil
}

// contextLimit is the most positions a model was trained for: config.json's
// max_position_embeddings, or what YaRN or linear RoPE scaling extends it to
// (factor × original_max_position_embeddings, as vLLM counts it); 0 when the
// config gives none.
func contextLimit(cfg *model.Config) (int, string) {
	limit, why := cfg.MaxPositionEmbeddings, "config.json's max_position_embeddings"
	r := cfg.RoPE
	if (r.Type == "yarn" || r.Type == "linear") && r.Factor > 1 {
		orig := r.OriginalMaxPositions
		if orig <= 0 || r.Type == "linear" {
			orig = float64(cfg.MaxPositionEmbeddings)
		}
		if l := r.Factor * orig; l > float64(limit) && l < 1<<40 {
			limit, why = int(l), fmt.Sprintf("%s RoPE scaling: factor %g × %g positions", r.Type, r.Factor, orig)
		}
	}
	return limit, why
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hasChatTemplate reports whether tokenizer.Load would find a chat template
// in dir: tokenizer_config.json's chat_template, or chat_template.jinja. A
// tokenizer_config.json that does not parse counts as having one: loading
// then reports what is wrong with it.
func hasChatTemplate(dir string) bool {
	if exists(filepath.Join(dir, "chat_template.jinja")) {
		return true
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return false
	}
	var cfg map[string]json.RawMessage
	if err != nil || json.Unmarshal(b, &cfg) != nil {
		return true
	}
	v, ok := cfg["chat_template"]
	return ok && string(v) != "null"
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stdout)
	if err != nil || o == nil {
		return err
	}
	if o.model == "" {
		if o.model, err = defaultmodel.Dir(); err != nil {
			return err
		}
	}
	if err := checkFolder(o); err != nil {
		return err
	}
	m, err := engine.Load(o.model, engine.Options{Device: o.device, Threads: o.threads, ContextLength: o.ctx, Attention: o.attention,
		Speculative: o.speculative(), Experts: o.experts})
	if err != nil {
		return err
	}
	defer m.Close()
	fmt.Fprintf(stderr, "loaded %s (%s) in %.2fs on %s\n", o.model, m.Config().ModelType, m.LoadTime().Seconds(), m.Device())
	if p := m.ExpertPlan(); p != nil {
		fmt.Fprintf(stderr, "%s\n", p)
	}
	prompt := o.ids
	if o.promptSet {
		if prompt, err = m.Encode(o.prompt, o.chat); err != nil {
			return err
		}
		if len(prompt) == 0 {
			return usagef("the prompt %q encodes to no tokens", o.prompt)
		}
	}
	asText := m.Tokenizer() != nil
	s, err := m.NewSession(0)
	if err != nil {
		return err
	}
	if o.seed >= 0 {
		o.sampling.Seed = uint64(o.seed)
	} else {
		o.sampling.Seed = uint64(randomSeed())
		if o.sampling.Temperature > 0 { // greedy draws nothing
			fmt.Fprintf(stderr, "seed %d (-seed %d repeats this run)\n", o.sampling.Seed, o.sampling.Seed)
		}
	}
	opts := engine.GenerateOptions{MaxTokens: o.maxTokens, Sampling: o.sampling, StopStrings: o.stops}
	if o.ignoreEOS {
		opts.StopTokens = []int{}
	}

	// From here Ctrl-C stops generation and returns errInterrupted; before,
	// while the weights load, it ends the process as usual.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sep := "" // between ids
	if o.echo {
		switch {
		case o.promptSet:
			_, err = io.WriteString(stdout, o.prompt)
		case asText:
			var text string
			if text, err = m.Decode(prompt); err == nil {
				_, err = io.WriteString(stdout, text)
			}
		default:
			for _, id := range prompt {
				if _, err = fmt.Fprintf(stdout, "%s%d", sep, id); err != nil {
					break
				}
				sep = " "
			}
		}
		if err != nil {
			return err
		}
	}
	res, err := s.Generate(ctx, prompt, opts, func(t engine.Token) error {
		if asText { // the engine decodes a token's text after the prompt's (its leading space kept)
			_, err := io.WriteString(stdout, t.Text)
			return err
		}
		_, err := fmt.Fprintf(stdout, "%s%d", sep, t.ID)
		sep = " "
		return err
	})
	fmt.Fprintln(stdout)
	interrupted := errors.Is(err, context.Canceled) && ctx.Err() != nil
	if res != nil && res.PromptDuration > 0 {
		reason := string(res.Reason)
		if interrupted {
			reason = "interrupted"
		} else if err != nil {
			reason = "failed"
		}
		fmt.Fprintf(stderr, "prompt: %d tokens, %.1f tokens/s; decode: %d tokens, %.1f tokens/s (%s)\n",
			res.PromptTokens, res.PromptTokensPerSecond(), len(res.Tokens), res.DecodeTokensPerSecond(), reason)
		if st := m.SpeculativeStats(); o.draft > 0 {
			fmt.Fprintf(stderr, "drafts: %d verify passes, %d of %d drafts accepted (%.0f%%)\n",
				st.Steps, st.Accepted, st.Drafted, 100*st.AcceptanceRate())
		}
	}
	if interrupted {
		return errInterrupted
	}
	return err
}

// randomSeed is the seed used when -seed is -1.
func randomSeed() int64 { return time.Now().UnixNano() & (1<<62 - 1) }

// speculative is the engine's speculative decoding for -draft.
func (o *options) speculative() engine.SpeculativeOptions {
	if o.draft <= 0 {
		return engine.SpeculativeOptions{Mode: "off"}
	}
	return engine.SpeculativeOptions{Mode: "on", Tokens: o.draft}
}
