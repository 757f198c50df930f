package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// benchArgs parses args as the command does, with a small copy buffer.
func benchArgs(t *testing.T, args ...string) *options {
	t.Helper()
	o, err := parseFlags(append([]string{"-copy-mib", "4"}, args...), &bytes.Buffer{})
	if err != nil {
		t.Fatalf("parseFlags(%q): %v", args, err)
	}
	return o
}

// TestRunTiny runs the bench on the tiny random shape on the CPU: JSON, then
// text from the kept checkpoint, and checks the numbers against the shape.
func TestRunTiny(t *testing.T) {
	const p, n = 8, 4
	keep := filepath.Join(t.TempDir(), "tiny")
	var stdout, stderr bytes.Buffer
	o := benchArgs(t, "-random", "tiny-llama", "-keep", keep, "-device", "cpu", "-threads", "2",
		"-p", strconv.Itoa(p), "-n", strconv.Itoa(n), "-r", "2", "-o", "json")
	if err := run(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	var res []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, stdout.String())
	}
	if len(res) != 2 || res[0]["test"] != "pp8" || res[1]["test"] != "tg4" {
		t.Fatalf("results %v, want pp8 then tg4", res)
	}
	var rows []result
	if err := json.Unmarshal(stdout.Bytes(), &rows); err != nil {
		t.Fatal(err)
	}
	spec, _ := testmodel.Shape("tiny-llama")
	l := spec.Model.(testmodel.Llama)
	for _, r := range rows {
		if r.Model != "tiny-llama" || !r.Random || r.Dir != keep || r.ModelType != "llama" || r.Layers != l.Layers {
			t.Errorf("%s: model fields %+v", r.Test, r)
		}
		if r.SizeBytes != spec.CheckpointBytes() {
			t.Errorf("%s: size %d, want the checkpoint's %d", r.Test, r.SizeBytes, spec.CheckpointBytes())
		}
		if r.Device != "cpu (2 threads)" || r.LoadSeconds <= 0 || r.Reps != 2 || len(r.Samples) != 2 {
			t.Errorf("%s: device %q, load %v s, reps %d, samples %v", r.Test, r.Device, r.LoadSeconds, r.Reps, r.Samples)
		}
		if !(r.TokS > 0) || r.Best < r.TokS || r.Stddev < 0 || math.IsInf(r.TokS, 0) {
			t.Errorf("%s: tok/s %v, best %v, stddev %v", r.Test, r.TokS, r.Best, r.Stddev)
		}
		if !(r.CopyBandwidth > 0) {
			t.Errorf("%s: copy bandwidth %v", r.Test, r.CopyBandwidth)
		}
	}
	pp, tg := rows[0], rows[1]
	if pp.Prompt != p || pp.Gen != 0 || pp.BytesPerToken != 0 || pp.FloorTokS != 0 {
		t.Errorf("pp row %+v", pp)
	}
	// What a decode step reads, from the shape: the linears and LM head,
	// one bf16 embedding row, and f32 K and V of every layer at the mean
	// context of the n steps after the p-token prompt.
	hd := l.Hidden / l.Heads
	kvPos := int64(2 * l.Layers * l.KVHeads * hd * 4)
	mean := float64(p) + float64(n+1)/2
	want := l.WeightBytes() + int64(2*l.Hidden) + int64(math.Round(float64(kvPos)*mean))
	if tg.Prompt != p || tg.Gen != n || tg.KVBytesPerPos != kvPos || tg.MeanContext != mean {
		t.Errorf("tg row: prompt %d gen %d, KV %d a position at mean context %v; want %d, %d, %d, %v",
			tg.Prompt, tg.Gen, tg.KVBytesPerPos, tg.MeanContext, p, n, kvPos, mean)
	}
	if tg.BytesPerToken != want || tg.WeightBytes != l.WeightBytes() || tg.EmbedRowBytes != int64(2*l.Hidden) {
		t.Errorf("bytes per token %d (weights %d, row %d, KV %d), want %d (weights %d)",
			tg.BytesPerToken, tg.WeightBytes, tg.EmbedRowBytes, tg.KVBytes, want, l.WeightBytes())
	}
	if floor := tg.CopyBandwidth / float64(want); math.Abs(tg.FloorTokS-floor) > 1e-9*floor || math.Abs(tg.FloorShare-tg.TokS/floor) > 1e-9 {
		t.Errorf("floor %v tok/s (share %v), want %v (%v)", tg.FloorTokS, tg.FloorShare, floor, tg.TokS/floor)
	}

	// Again as text, from the kept checkpoint.
	stdout.Reset()
	stderr.Reset()
	o = benchArgs(t, "-random", "tiny-llama", "-keep", keep, "-device", "cpu", "-p", "8", "-n", "4", "-r", "1", "-warmup=false")
	if err := run(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "reusing the tiny-llama checkpoint") || strings.Contains(stderr.String(), "writing") {
		t.Errorf("the kept checkpoint was not reused:\n%s", stderr.String())
	}
	text := stdout.String()
	for _, re := range []string{`(?m)^loaded: +in \S+ on cpu`, `(?m)^copy: +[0-9.]+ GB/s`,
		`(?m)^\| model +\| type +\| +size \| device +\| test \| +t/s \| +B/tok \| floor t/s \| of floor \|$`,
		`(?m)^\| tiny-llama \| llama 2L \| .* \| +pp8 \| +[0-9.]+ ± 0\.00 \| +\| +\| +\|$`,
		`(?m)^\| tiny-llama \| llama 2L \| .* \| +tg4 \| +[0-9.]+ ± 0\.00 \| +[0-9.]+ kB \| +[0-9.]+ \| +[0-9.]+% \|$`} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("text output does not match %s:\n%s", re, text)
		}
	}
	if _, err := os.Stat(filepath.Join(keep, "config.json")); err != nil {
		t.Errorf("-keep folder lost its checkpoint: %v", err)
	}
}

// TestRandomTempRemoved checks that -random without -keep leaves nothing.
func TestRandomTempRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // os.MkdirTemp's folder
	var stdout, stderr bytes.Buffer
	o := benchArgs(t, "-random", "tiny-llama", "-device", "cpu", "-p", "4", "-n", "0", "-r", "1", "-o", "json")
	if err := run(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("the temporary checkpoint was left: %v", entries)
	}
	var res []result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || len(res) != 1 || res[0].Test != "pp4" {
		t.Errorf("-n 0: results %+v (%v), want pp4 alone", res, err)
	}

	// -p 0: tg alone, after a one-token prompt.
	stdout.Reset()
	o = benchArgs(t, "-random", "tiny-llama", "-device", "cpu", "-p", "0", "-n", "2", "-r", "1", "-o", "json")
	if err := run(context.Background(), o, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	res = nil
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil || len(res) != 1 || res[0].Test != "tg2" || res[0].MeanContext != 2.5 || !(res[0].TokS > 0) {
		t.Errorf("-p 0: results %+v (%v), want tg2 alone at mean context 2.5", res, err)
	}
}

// TestErrors checks that bad flags and folders give errors naming them.
func TestErrors(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	empty := filepath.Join(tmp, "empty")
	os.Mkdir(empty, 0o755)
	foreign := filepath.Join(tmp, "foreign")
	os.Mkdir(foreign, 0o755)
	os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o644)
	os.WriteFile(filepath.Join(foreign, "model.safetensors"), []byte("mine"), 0o644)
	for _, c := range []struct {
		args []string
		want string // a regexp the error must match
	}{
		{nil, `-model DIR.*-random NAME`},
		{[]string{"-model", "x", "-random", "tiny-llama"}, `-model and -random both given`},
		{[]string{"-model", filepath.Join(tmp, "missing")}, `-model .*missing: no such folder`},
		{[]string{"-model", file}, `-model .*file: not a folder`},
		{[]string{"-model", empty}, `-model .*empty: .*config\.json`},
		{[]string{"-random", "nope"}, `(?s)-random "nope": no such shape.*deepseek-v4-bench .*llama3-8b .*tiny-llama`},
		{[]string{"-random", "tiny-llama", "-p", "40000", "-n", "1000"}, `-p 40000 and -n 1000 need 41001 positions.*context of 40960 \(max_position_embeddings in .*config\.json\)`},
		{[]string{"-random", "tiny-llama", "-p", "0", "-n", "40960"}, `need 40962 positions`},
		{[]string{"-random", "tiny-llama", "-device", "tpu"}, `-device "tpu": want auto, cpu or cuda`},
		{[]string{"-random", "tiny-llama", "-o", "xml"}, `-o "xml": want text or json`},
		{[]string{"-random", "tiny-llama", "-r", "0"}, `-r 0: want at least 1`},
		{[]string{"-random", "tiny-llama", "-p", "-1"}, `-p -1: want >= 0`},
		{[]string{"-random", "tiny-llama", "-n", "-2"}, `-n -2: want >= 0`},
		{[]string{"-random", "tiny-llama", "-p", "0", "-n", "0"}, `nothing to measure`},
		{[]string{"-random", "tiny-llama", "-threads", "-1"}, `-threads -1`},
		{[]string{"-model", empty, "-keep", tmp}, `-keep needs -random`},
		{[]string{"-random", "tiny-llama", "-keep", foreign}, `-keep .*foreign: the folder is not empty and holds no random checkpoint`},
		{[]string{"-random", "tiny-llama", "extra"}, `unexpected argument "extra"`},
		{[]string{"-random", "tiny-llama", "-copy-mib", "0"}, `-copy-mib 0`},
	} {
		var stdout, stderr bytes.Buffer
		o, err := parseFlags(c.args, &stderr)
		if err == nil {
			o.copyBytes = 1 << 20
			err = run(context.Background(), o, &stdout, &stderr)
		}
		if err == nil {
			t.Errorf("%q: no error", c.args)
			continue
		}
		if !regexp.MustCompile(c.want).MatchString(err.Error()) {
			t.Errorf("%q: error %q, want one matching %s", c.args, err, c.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(foreign, "model.safetensors")); err != nil || string(b) != "mine" {
		t.Errorf("-keep touched a folder that is not a random checkpoint's: %q, %v", b, err)
	}
	if !kernels.Available() {
		var stdout, stderr bytes.Buffer
		o := benchArgs(t, "-random", "tiny-llama", "-device", "cuda", "-p", "4", "-n", "2", "-r", "1")
		if err := run(context.Background(), o, &stdout, &stderr); err == nil || !strings.HasPrefix(err.Error(), "-device cuda: ") {
			t.Errorf("-device cuda without a GPU: %v", err)
		}
	}
}

// TestRandomCancelled checks that a cancelled write returns the
// cancellation and leaves no temporary folder.
func TestRandomCancelled(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, benchArgs(t, "-random", "tiny-llama", "-device", "cpu", "-p", "4", "-n", "2"), &stdout, &stderr)
	if err != context.Canceled {
		t.Errorf("cancelled run: %v, want context.Canceled", err)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Errorf("the temporary checkpoint was left: %v", entries)
	}
}

// countV4 writes spec's checkpoint and returns countWeights' answer on it
// with the checkpoint opened (closed when the test ends).
func countV4(t *testing.T, spec testmodel.DeepseekV4) (weightBytes, *weights.Checkpoint) {
	t.Helper()
	dir := testmodel.WriteTemp(t, spec)
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := countWeights(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return got, ck
}

// TestCountWeightsExperts checks the routed experts' share on a tiny
// DeepSeek-V4 checkpoint: testmodel's WeightBytes less the tensors of rank
// under 2 (norms, sinks, mHC bases and scales, NVFP4 global scales), which
// the bench leaves out.
func TestCountWeightsExperts(t *testing.T) {
	v4 := testmodel.DeepseekV4{Vocab: 256, Hidden: 64, Layers: 2, Heads: 4, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16,
		Window: 6, RateCSA: 2, RateHCA: 5, IndexHeads: 2, IndexDim: 16, IndexTopK: 3, HCMult: 4, HCIters: 5,
		Experts: 8, TopK: 2, MoEFFN: 32, RopeDim: 8, HashLayers: 1, Seed: 1}
	got, ck := countV4(t, v4)
	want := v4.WeightBytes()
	var small, expertSmall int64
	for _, name := range ck.Names() {
		tn, _ := ck.Tensor(name)
		switch {
		case len(tn.Shape) >= 2, strings.HasSuffix(name, "ffn.gate.bias"): // the bias is not in WeightBytes
		case routedExpert.MatchString(name):
			expertSmall += int64(len(tn.Data))
		default:
			small += int64(len(tn.Data))
		}
	}
	want -= small + expertSmall*2/8
	if got.perToken != want || got.embedRow != 64*2 || got.experts != "2 of 8 routed experts" || got.checkpoint != v4.CheckpointBytes() {
		t.Errorf("countWeights = %+v, want %d bytes a token, a 128-byte row, 2 of 8 experts, %d in all", got, want, v4.CheckpointBytes())
	}
}

// TestCountWeightsMXFP4 checks that DeepSeek-V4's released MXFP4 experts
// (I8 packed codes, which isInteger would leave out as a table) count in
// the bytes a step reads, top-k of them, beside their E8M0 scales, and
// that one row of its embedding (DeepSeek's embed.weight) counts, not the
// table; and that
// -layers cuts a shape to its first layers.
func TestCountWeightsMXFP4(t *testing.T) {
	v4 := testmodel.DeepseekV4{Vocab: 256, Hidden: 64, Layers: 2, Heads: 4, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16,
		Window: 6, RateCSA: 2, RateHCA: 5, IndexHeads: 2, IndexDim: 16, IndexTopK: 3, HCMult: 4, HCIters: 5,
		Experts: 8, TopK: 2, MoEFFN: 32, RopeDim: 8, HashLayers: 1, Seed: 1, Released: testmodel.V4FP8MXFP4}
	got, ck := countV4(t, v4)
	var want, expert, packed int64
	for _, name := range ck.Names() {
		tn, _ := ck.Tensor(name)
		n := int64(len(tn.Data))
		switch {
		case len(tn.Shape) < 2:
		case routedExpert.MatchString(name):
			expert += n
			if tn.DType == weights.I8 {
				packed += n
			}
		case name == "embed.weight" || tn.DType == weights.I64:
		default:
			want += n
		}
	}
	if packed == 0 {
		t.Fatal("no I8 routed expert tensors: the fixture is not MXFP4")
	}
	want += expert * 2 / 8
	if got.perToken != want || got.embedRow != 64*2 || got.experts != "2 of 8 routed experts" {
		t.Errorf("countWeights = %+v, want %d bytes a token (routed experts %d bytes, %d of them packed I8)", got, want, expert, packed)
	}

	o := benchArgs(t, "-random", "deepseek-v4-flash", "-layers", "2")
	spec, err := o.shape()
	if err != nil {
		t.Fatal(err)
	}
	full, _ := testmodel.Shape("deepseek-v4-flash")
	if spec.Name != "deepseek-v4-flash-2l" || spec.CheckpointBytes() >= full.CheckpointBytes()/10 {
		t.Errorf("-layers 2: %s, %d bytes (the whole shape %d)", spec.Name, spec.CheckpointBytes(), full.CheckpointBytes())
	}
	c, err := spec.Config()
	if err != nil {
		t.Fatal(err)
	}
	var fields struct {
		Layers int `json:"num_hidden_layers"`
	}
	if err := json.Unmarshal(c, &fields); err != nil || fields.Layers != 2 {
		t.Errorf("-layers 2: config.json num_hidden_layers %d (%v)", fields.Layers, err)
	}
	for _, args := range [][]string{{"-layers", "2", "-model", "x"}, {"-random", "deepseek-v3-2l", "-layers", "1"}, {"-random", "deepseek-v4-flash", "-layers", "44"}} {
		if _, err := parseFlags(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
