package testmodel_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/modeltest"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// tinyV4 has every layer kind, a hash-routed layer, and a vocabulary large
// enough that the LM head is generated in more than one chunk.
var tinyV4 = testmodel.DeepseekV4{
	Vocab: 1100, Hidden: 64, Layers: 4, Heads: 4, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16, Window: 6,
	RateCSA: 2, RateHCA: 5, IndexHeads: 2, IndexDim: 16, IndexTopK: 3, HCMult: 4, HCIters: 5,
	Experts: 8, TopK: 2, MoEFFN: 32, RopeDim: 8, HashLayers: 1,
	LayerTypes: []string{testmodel.V4HCA, testmodel.V4CSA, testmodel.V4Sliding, testmodel.V4CSA}, Seed: 7,
}

// TestDeepseekV4Generates writes a tiny random checkpoint, loads it on the
// CPU through the engine and generates a few tokens.
func TestDeepseekV4Generates(t *testing.T) {
	_, s := modeltest.Open(t, testmodel.WriteTemp(t, tinyV4), engine.Options{Device: "cpu", ContextLength: 64})
	prompt := make([]int, 13)
	for i := range prompt {
		prompt[i] = (i*389 + 5) % tinyV4.Vocab
	}
	logits, err := s.Append(context.Background(), prompt)
	if err != nil {
		t.Fatal(err)
	}
	if len(logits) != tinyV4.Vocab {
		t.Fatalf("%d logits, want %d", len(logits), tinyV4.Vocab)
	}
	for i, v := range logits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %v", i, v)
		}
	}
	res, err := s.Generate(context.Background(), nil, engine.GenerateOptions{MaxTokens: 12, StopTokens: []int{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tokens) != 12 || s.Len() != 13+12 {
		t.Fatalf("generated %d tokens (session %d), want 12 (25)", len(res.Tokens), s.Len())
	}
	for _, id := range res.Tokens {
		if id < 0 || id >= tinyV4.Vocab {
			t.Fatalf("token %d outside the vocabulary", id)
		}
	}
}

// TestDeepseekV4Bytes checks WeightBytes and CheckpointBytes against the
// tensors in the written file, and that a second write gives the same bytes.
func TestDeepseekV4Bytes(t *testing.T) {
	dirs := []string{testmodel.WriteTemp(t, tinyV4), testmodel.WriteTemp(t, tinyV4)}
	ck, err := weights.Open(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	expert := regexp.MustCompile(`\.ffn\.experts\.(\d+)\.`)
	var all, read int64
	for _, name := range ck.Names() {
		tn, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(len(tn.Data))
		all += n
		switch {
		case name == "model.embed_tokens.weight", regexp.MustCompile(`ffn\.gate\.(tid2eid|bias)$`).MatchString(name):
		case expert.MatchString(name):
			// Every expert is the same size: count the first TopK of each layer.
			if e, _ := strconv.Atoi(expert.FindStringSubmatch(name)[1]); e < tinyV4.TopK {
				read += n
			}
		default:
			read += n
		}
	}
	if got := tinyV4.WeightBytes(); got != read {
		t.Errorf("WeightBytes = %d, the file's tensors say %d", got, read)
	}
	if got := tinyV4.CheckpointBytes(); got != all {
		t.Errorf("CheckpointBytes = %d, the file holds %d", got, all)
	}
	for _, f := range []string{"config.json", "hf_quant_config.json", "model.safetensors"} {
		a, errA := os.ReadFile(filepath.Join(dirs[0], f))
		b, errB := os.ReadFile(filepath.Join(dirs[1], f))
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two writes of the same spec", f)
		}
	}
}

// TestDeepseekV4Defaults checks the default (V4-Flash) shape: the expert
// count changes the bytes a step reads only through the bf16 router.
func TestDeepseekV4Defaults(t *testing.T) {
	a := testmodel.DeepseekV4{Experts: 16}
	b := testmodel.DeepseekV4{Experts: 32}
	if got, want := b.WeightBytes()-a.WeightBytes(), int64(43*16*4096*2); got != want {
		t.Errorf("32 experts read %d bytes more than 16, want %d (the router)", got, want)
	}
	if a.CheckpointBytes() >= b.CheckpointBytes() {
		t.Errorf("CheckpointBytes %d with 16 experts, %d with 32", a.CheckpointBytes(), b.CheckpointBytes())
	}
	if _, err := (testmodel.DeepseekV4{Hidden: 100}).Config(); err == nil {
		t.Error("hidden 100 (not a multiple of 16) accepted")
	}
}
