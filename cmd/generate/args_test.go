package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/modeltest"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/internal/testproc"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// tinyLlama is a small random Llama (no tokenizer: ids in, ids out).
var tinyLlama = testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 1}

// configFolder writes a model folder that holds a config.json and the given
// files but no weights: a run that gets past the argument checks fails in
// engine.Load, so an error from the checks shows they came first. edit
// changes the config's fields (nil: removes one).
func configFolder(t *testing.T, config []byte, edit map[string]any, files map[string]string) string {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(config, &cfg); err != nil {
		t.Fatal(err)
	}
	for k, v := range edit {
		if v == nil {
			delete(cfg, k)
		} else {
			cfg[k] = v
		}
	}
	dir := t.TempDir()
	all := map[string]string{"config.json": mustJSON(t, cfg)}
	for name, data := range files {
		all[name] = data
	}
	for name, data := range all {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func llamaConfig(t *testing.T) []byte {
	t.Helper()
	b, err := tinyLlama.Config()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A tokenizer.json small enough to write inline (the checks only look for
// the file; it is valid all the same).
const tinyTokenizer = `{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`

// TestArgsCheckedBeforeLoad runs each wrong argument against model folders
// without weights: each must be refused with its own message as a usage
// error (exit status 2), before engine.Load, which would fail on the
// missing safetensors. The cases that are right get that load error.
func TestArgsCheckedBeforeLoad(t *testing.T) {
	llama := configFolder(t, llamaConfig(t), map[string]any{"max_position_embeddings": 64, "num_hidden_layers": 2}, nil)
	yarn := configFolder(t, llamaConfig(t), map[string]any{"max_position_embeddings": 64,
		"rope_scaling": map[string]any{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}}, nil)
	noPositions := configFolder(t, llamaConfig(t), map[string]any{"max_position_embeddings": nil}, nil)
	v4config, err := os.ReadFile("../../internal/defaultmodel/nvfp4/config.json")
	if err != nil {
		t.Fatal(err)
	}
	v4 := configFolder(t, v4config, nil, nil)
	withTok := configFolder(t, llamaConfig(t), nil, map[string]string{
		"tokenizer.json": tinyTokenizer, "tokenizer_config.json": `{"bos_token":"a","chat_template":null}`})
	withJinja := configFolder(t, llamaConfig(t), nil, map[string]string{
		"tokenizer.json": tinyTokenizer, "chat_template.jinja": "{{ messages[0].content }}"})
	withConfigTemplate := configFolder(t, llamaConfig(t), nil, map[string]string{
		"tokenizer.json": tinyTokenizer, "tokenizer_config.json": `{"chat_template":"{{ messages[0].content }}"}`})
	file := filepath.Join(llama, "config.json")

	for _, tc := range []struct {
		args []string
		want string // "" for arguments that pass the checks
	}{
		{[]string{"-model", llama}, "no prompt"},
		{[]string{"-model", llama, "-ids", "1", "-prompt", "x"}, "one of the two"},
		{[]string{"-model", llama, "-prompt", ""}, "the prompt is empty"},
		{[]string{"-model", llama, "-ids", ""}, "-ids is empty"},
		{[]string{"-model", llama, "-ids", "1,x"}, `"x" is not a token id`},
		{[]string{"-model", llama, "-ids", "1,,2"}, `"" is not a token id`},
		{[]string{"-model", llama, "-ids", "-3"}, `"-3" is not a token id`},
		{[]string{"-model", llama, "-ids", "40"}, "vocabulary has ids 0..39"},
		{[]string{"-model", llama, "-ids", "39"}, ""},
		{[]string{"-model", llama, "-ids", "1", "extra"}, `unexpected argument "extra"`},
		{[]string{"-model", llama, "-ids", "1", "2"}, `-ids takes one list`},
		{[]string{"-model", llama, "-prompt", "x", "-chat", "extra"}, `unexpected argument "extra"`},
		{[]string{"-model", llama, "-prompt", "hello", "world"}, `-prompt "hello world"`},
		{[]string{"-model", llama, "-prompt", "hello"}, "no tokenizer.json"},
		{[]string{"-model", llama, "-ids", "1", "-stop", "x"}, "-stop"},
		{[]string{"-model", llama, "-ids", "1", "-stop", ""}, "empty stop string"},
		{[]string{"-model", llama, "-ids", "1", "-chat"}, "-chat renders -prompt"},
		{[]string{"-model", withTok, "-prompt", "hi", "-chat"}, "no chat template"},
		{[]string{"-model", withJinja, "-prompt", "hi", "-chat"}, ""},
		{[]string{"-model", withConfigTemplate, "-prompt", "hi", "-chat"}, ""},
		{[]string{"-model", withConfigTemplate, "-prompt", "", "-chat"}, ""}, // an empty message is a conversation
		{[]string{"-model", withConfigTemplate, "-prompt", "hi", "-chat", "-echo"}, "-echo with -chat"},
		{[]string{"-model", withTok, "-prompt", "hi", "-stop", `\n`}, ""},
		{[]string{"-model", llama, "-ids", "1", "-ctx", "65"}, "-ctx 65: the model's context is 64 positions"},
		{[]string{"-model", llama, "-ids", "1", "-ctx", "64"}, ""},
		{[]string{"-model", llama, "-ids", "1", "-ctx", "-1"}, "-ctx -1"},
		{[]string{"-model", yarn, "-ids", "1", "-ctx", "128"}, ""},
		{[]string{"-model", yarn, "-ids", "1", "-ctx", "129"}, "yarn RoPE scaling: factor 4 × 32 positions"},
		{[]string{"-model", noPositions, "-ids", "1", "-ctx", "100000"}, ""},
		{[]string{"-model", v4, "-ids", "1", "-attention", "htree"}, "deepseek_v4 model; htree runs on llama and qwen3"},
		{[]string{"-model", v4, "-ids", "1", "-attention", "dense"}, ""},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree"}, ""},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:rate=4,topk=8,dense=64,first-layer=1"}, ""},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:first-layer=2"}, "the model has layers 0..1"},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:rate=1"}, "rate 1"},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:rate=4,rate=8"}, "rate given twice"},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:depth=3"}, "the parameters are rate, topk, dense and first-layer"},
		{[]string{"-model", llama, "-ids", "1", "-attention", "htree:topk"}, `"topk": want key=N`},
		{[]string{"-model", llama, "-ids", "1", "-attention", "dense:topk=3"}, "dense attention takes no parameters"},
		{[]string{"-model", llama, "-ids", "1", "-attention", "sparse"}, "want dense or htree"},
		{[]string{"-model", llama, "-ids", "1", "-htree-topk", "8"}, "flag provided but not defined: -htree-topk"},
		{[]string{"-model", llama, "-ids", "1", "-device", "tpu"}, `-device "tpu"`},
		{[]string{"-model", llama, "-ids", "1", "-threads", "-2"}, "-threads -2"},
		{[]string{"-model", llama, "-ids", "1", "-max-tokens", "-1"}, "-max-tokens"},
		{[]string{"-model", llama, "-ids", "1", "-top-p", "1.5"}, "TopP"},
		{[]string{"-model", llama, "-ids", "1", "-temperature", "NaN"}, "Temperature"},
		{[]string{"-model", llama, "-ids", "1", "-seed", "-2"}, "-seed -2"},
		{[]string{"-model", file, "-ids", "1"}, "is a file: give the model's folder"},
	} {
		var out, errOut bytes.Buffer
		err := run(tc.args, &out, &errOut)
		var ue *usageError
		switch {
		case tc.want == "" && (err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "safetensors")):
			t.Errorf("%q: error %v, want the load's, for the missing weights", tc.args, err)
		case tc.want != "" && (!errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want a usage error mentioning %q", tc.args, err, tc.want)
		}
		if tc.want != "" && errOut.Len() > 0 {
			t.Errorf("%q: stderr %q before the error", tc.args, errOut.String())
		}
	}
	// A missing folder is not a usage error, but it is found before any load.
	err = run([]string{"-model", filepath.Join(llama, "missing"), "-ids", "1"}, new(bytes.Buffer), new(bytes.Buffer))
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing folder: %v", err)
	}
}

// TestHelp: -h and -help print the synopsis, examples and every flag to
// stdout and succeed.
func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out, errOut bytes.Buffer
		err := run([]string{arg}, &out, &errOut)
		if err != nil || exitCode(err, &errOut) != 0 {
			t.Errorf("%s: %v, want success", arg, err)
		}
		for _, want := range []string{"usage: generate", "Examples:", `generate -prompt "func main() {"`, "-attention", "htree:rate=R,topk=K,dense=N,first-layer=L",
			"-echo", "-seed", "Exit status"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: stdout lacks %q:\n%s", arg, want, out.String())
			}
		}
		if errOut.Len() > 0 {
			t.Errorf("%s: stderr %q", arg, errOut.String())
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		msg  string
	}{
		{nil, 0, ""},
		{errInterrupted, 130, "generate: interrupted\n"},
		{usagef("bad"), 2, "generate: bad\n(generate -h shows the flags and examples)\n"},
		{errors.New("broken"), 1, "generate: broken\n"},
	} {
		var errOut bytes.Buffer
		if code := exitCode(tc.err, &errOut); code != tc.code || errOut.String() != tc.msg {
			t.Errorf("exitCode(%v) = %d, stderr %q; want %d, %q", tc.err, code, errOut.String(), tc.code, tc.msg)
		}
	}
}

// TestSeedAndEcho runs a small random Llama: without -seed the seed in use
// goes to stderr and -seed with it repeats the run; stdout holds the prompt's
// ids, then the generated ones, unless -echo=false.
func TestSeedAndEcho(t *testing.T) {
	dir := testmodel.WriteTemp(t, tinyLlama)
	base := []string{"-model", dir, "-ids", "5,6,7", "-max-tokens", "6", "-ignore-eos", "-device", "cpu", "-temperature", "1.5", "-top-k", "0", "-min-p", "0"}
	gen := func(args ...string) (string, string) {
		t.Helper()
		return runOK(t, append(append([]string{}, base...), args...)...)
	}
	out, errOut := gen()
	m := regexp.MustCompile(`seed (\d+) \(-seed (\d+) repeats this run\)`).FindStringSubmatch(errOut)
	if m == nil || m[1] != m[2] {
		t.Fatalf("stderr %q: no seed line", errOut)
	}
	ids := strings.Fields(out)
	if len(ids) != 9 || strings.Join(ids[:3], ",") != "5,6,7" {
		t.Errorf("stdout %q: want the 3 prompt ids, then 6 generated", out)
	}
	again, errAgain := gen("-seed", m[1])
	if again != out {
		t.Errorf("-seed %s: stdout %q, the run that printed it %q", m[1], again, out)
	}
	if strings.Contains(errAgain, "seed") {
		t.Errorf("-seed given, yet stderr %q names one", errAgain)
	}
	if _, errGreedy := gen("-temperature", "0"); strings.Contains(errGreedy, "seed") {
		t.Errorf("greedy draws nothing, yet stderr %q names a seed", errGreedy)
	}
	noEcho, _ := gen("-seed", m[1], "-echo=false")
	if want := strings.Join(ids[3:], " ") + "\n"; noEcho != want {
		t.Errorf("-echo=false: stdout %q, want %q", noEcho, want)
	}
}

// TestInterrupt runs the command in a child process and sends it SIGINT
// while it generates: it must stop, write the rates, say "interrupted" and
// exit with status 130.
func TestInterrupt(t *testing.T) {
	if args := os.Getenv("GENERATE_TEST_MAIN_ARGS"); args != "" {
		var a []string
		if err := json.Unmarshal([]byte(args), &a); err != nil {
			t.Fatal(err)
		}
		os.Args = append([]string{"generate"}, a...)
		main() // exits
		return
	}
	if runtime.GOOS == "windows" {
		t.Skip("no SIGINT to send on Windows")
	}
	dir := testmodel.WriteTemp(t, tinyLlama)
	// 40960 positions (the model's context) take far longer than the test
	// waits: the signal comes after the first generated id.
	args := []string{"-model", dir, "-ids", "1,2", "-max-tokens", "0", "-ignore-eos", "-ctx", "40960", "-device", "cpu", "-echo=false"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInterrupt$")
	cmd.Env = append(os.Environ(), "GENERATE_TEST_MAIN_ARGS="+mustJSON(t, args))
	stdout, errOut := testproc.Start(t, cmd)
	first := make([]byte, 1)
	if _, err := stdout.Read(first); err != nil {
		t.Fatalf("no output: %v; stderr %q", err, errOut.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _ = bytes.NewBuffer(nil).ReadFrom(stdout)
		done <- cmd.Wait()
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("still running a minute after SIGINT; stderr %q", errOut.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("exit %v, want status 130; stderr %q", err, errOut.String())
	}
	t.Logf("stderr %q", errOut.String())
	for _, want := range []string{"decode:", "generate: interrupted"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
}

// TestEchoWordBoundary: with a SentencePiece-style tokenizer (Metaspace:
// each word's token carries its leading space, and decoding drops the
// space of a text's first token), the echoed prompt and the generated text
// must read as one decoding of all the ids, not with the first generated
// word glued to the prompt.
func TestEchoWordBoundary(t *testing.T) {
	dir := testmodel.WriteTemp(t, tinyLlama)
	vocab := map[string]int{}
	for i := range tinyLlama.Vocab {
		vocab[fmt.Sprintf("▁w%d", i)] = i
	}
	tok := mustJSON(t, map[string]any{
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
		"decoder": map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
	})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tok), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-model", dir, "-ids", "3,4", "-max-tokens", "5", "-ignore-eos", "-seed", "1", "-device", "cpu"}
	out, _ := runOK(t, args...)
	// The same generation through the API, decoded in one piece.
	m, s := modeltest.Open(t, dir, engine.Options{Device: "cpu"})
	o, _ := parseFlags(args, io.Discard)
	o.sampling.Seed = 1
	res, err := s.Generate(context.Background(), []int{3, 4}, engine.GenerateOptions{MaxTokens: 5, StopTokens: []int{}, Sampling: o.sampling}, nil)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := m.Decode(append([]int{3, 4}, res.Tokens...))
	if err != nil {
		t.Fatal(err)
	}
	if out != whole+"\n" {
		t.Errorf("stdout %q, want %q", out, whole+"\n")
	}
}

func TestParseExperts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want model.ExpertPlacement
		bad  bool
	}{
		{in: "auto", want: model.ExpertPlacement{Mode: "auto"}},
		{in: "host", want: model.ExpertPlacement{Mode: "host"}},
		{in: "device", want: model.ExpertPlacement{Mode: "device"}},
		{in: "120", want: model.ExpertPlacement{Mode: "count", Count: 120}},
		{in: "40GiB", want: model.ExpertPlacement{Mode: "budget", Budget: 40 << 30}},
		{in: "1.5GiB", want: model.ExpertPlacement{Mode: "budget", Budget: 3 << 29}},
		{in: "500MiB", want: model.ExpertPlacement{Mode: "budget", Budget: 500 << 20}},
		{in: "-1", bad: true},
		{in: "-2GiB", bad: true},
		{in: "gpu", bad: true},
		{in: "", bad: true},
	} {
		got, err := parseExperts(tc.in)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), "-experts") {
				t.Errorf("%q: err %v, want one naming -experts", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
