package model

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// FuzzConfig loads a small random checkpoint (a Llama, or a DeepSeek-V4 when
// ck is odd) under any config.json: whatever the config says, loading either
// fails with an error (one naming config.json, or one naming the checkpoint,
// for a tensor it lacks or that disagrees) or gives a model whose forward
// pass over two tokens returns finite logits of the vocabulary's size. It
// must never panic or allocate without bound.
//
// Each input builds on checkpoints opened once, from a config parsed in
// memory (as ReadFolder reads it from the folder): writing a folder for each
// input and reading it back held the fuzzer to 16 executions a minute. The
// seeds are compact JSON, the DeepSeek-V4 one cut to the fields that change
// its logits (seedConfig): the fuzzer minimizes each input that finds new
// coverage, at a cost that grows with the square of its length, so inputs
// over maxFuzzConfig bytes are skipped.
func FuzzConfig(f *testing.F) {
	llama, v4 := fuzzCheckpoints(f)
	checkpoints := []*weights.Checkpoint{openCheckpoint(f, llama), openCheckpoint(f, v4)}
	for i, ck := range checkpoints {
		f.Add(uint8(i), seedConfig(f, ck))
	}
	for _, s := range []string{
		`{"model_type":"qwen3","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":8,"vocab_size":50,"max_position_embeddings":64,"rms_norm_eps":1e-6,"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"rms_norm_eps":-1,"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"rope_theta":0,"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192},"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"rope_scaling":{"rope_type":"yarn","factor":4,"original_max_position_embeddings":16},"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"partial_rotary_factor":0.5,"tie_word_embeddings":false}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":-8,"vocab_size":50,"tie_word_embeddings":false}`,
		`{"model_type":"deepseek_v32","hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50}`,
		`{"model_type":"deepseek_v4","hidden_size":32,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":50}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":1000000000,"num_attention_heads":4,"vocab_size":50}`,
		`{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":50,"max_position_embeddings":9000000000000000000,"tie_word_embeddings":false}`,
	} {
		f.Add(uint8(0), []byte(s))
	}
	f.Fuzz(func(t *testing.T, ck uint8, config []byte) {
		if len(config) > maxFuzzConfig {
			return
		}
		if msg := checkConfig(t, checkpoints[int(ck)%len(checkpoints)], config); msg != "" {
			t.Fatal(msg)
		}
	})
}

// TestConfigFieldEdges sets each field of the FuzzConfig checkpoints'
// configs, one at a time, to edge values (zero, negative, huge, fractional,
// another type) and holds the result to FuzzConfig's rule.
func TestConfigFieldEdges(t *testing.T) {
	llama, v4 := fuzzCheckpoints(t)
	checkFieldEdges(t, llama, v4)
}

// TestConfigFieldEdgesGolden is TestConfigFieldEdges on the fixtures'
// checkpoints (every architecture, the configs transformers wrote).
func TestConfigFieldEdgesGolden(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	dir := golden.Dir(t)
	var dirs []string
	for _, name := range golden.Models(t) {
		dirs = append(dirs, filepath.Join(dir, name))
	}
	checkFieldEdges(t, dirs...)
}

func checkFieldEdges(t *testing.T, checkpoints ...string) {
	edges := []any{0, -1, 1, 3, int64(1) << 40, int64(-1) << 40, 0.5, 1e308, -1e308, "x", nil, []any{}, map[string]any{}, true}
	for _, src := range checkpoints {
		ck := openCheckpoint(t, src)
		base, err := os.ReadFile(filepath.Join(src, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var cfg map[string]any
		if err := json.Unmarshal(base, &cfg); err != nil {
			t.Fatal(err)
		}
		for _, field := range slices.Sorted(maps.Keys(cfg)) {
			// The field itself, then each field of an object nested in it
			// (rope_parameters, compress_rates) and each entry of a list.
			sets := []func(v any) (string, map[string]any){func(v any) (string, map[string]any) {
				edited := maps.Clone(cfg)
				edited[field] = v
				return field, edited
			}}
			switch inner := cfg[field].(type) {
			case map[string]any:
				for _, k := range slices.Sorted(maps.Keys(inner)) {
					sets = append(sets, func(v any) (string, map[string]any) {
						edited, in := maps.Clone(cfg), maps.Clone(inner)
						in[k], edited[field] = v, in
						return field + "." + k, edited
					})
				}
			case []any:
				for i := range inner {
					sets = append(sets, func(v any) (string, map[string]any) {
						edited, in := maps.Clone(cfg), slices.Clone(inner)
						in[i], edited[field] = v, in
						return fmt.Sprintf("%s[%d]", field, i), edited
					})
				}
			}
			for _, set := range sets {
				for _, v := range edges {
					name, edited := set(v)
					data, _ := json.Marshal(edited)
					if msg := checkConfig(t, ck, data); msg != "" {
						t.Errorf("%s: %s = %v: %s", filepath.Base(src), name, v, msg)
					}
				}
			}
		}
	}
}

// fuzzCheckpoints writes FuzzConfig's two checkpoints: a Llama and a
// DeepSeek-V4 with every layer kind.
func fuzzCheckpoints(t testing.TB) (llama, v4 string) {
	llama, v4 = t.TempDir(), t.TempDir()
	if err := (testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 4, KVHeads: 2, Vocab: 50, DType: weights.F32, Seed: 1}).Write(llama); err != nil {
		t.Fatal(err)
	}
	spec := testmodel.DeepseekV4{
		Vocab: 64, Hidden: 32, Layers: 3, Heads: 2, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16, Window: 4,
		RateCSA: 2, RateHCA: 4, IndexHeads: 2, IndexDim: 16, IndexTopK: 2, HCMult: 2, HCIters: 3,
		Experts: 4, TopK: 2, MoEFFN: 16, RopeDim: 8, HashLayers: 1,
		LayerTypes: []string{testmodel.V4HCA, testmodel.V4CSA, testmodel.V4Sliding}, Seed: 2,
	}
	if err := spec.Write(v4); err != nil {
		t.Fatal(err)
	}
	return llama, v4
}

// maxConfigSeed bounds FuzzConfig's seeds, maxFuzzConfig its inputs: longer
// ones only cost minimizing time.
const maxConfigSeed, maxFuzzConfig = 768, 1024

// seedConfig returns the config.json of ck's folder as compact JSON, and,
// when that is longer than maxConfigSeed, without each top-level field
// (in name order) whose removal leaves the logits of two tokens the same.
func seedConfig(t testing.TB, ck *weights.Checkpoint) []byte {
	base, err := os.ReadFile(filepath.Join(ck.Dir(), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(base, &cfg); err != nil {
		t.Fatal(err)
	}
	logits := func(cfg map[string]any) []float32 {
		data, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseConfig(filepath.Join(ck.Dir(), "config.json"), data)
		if err != nil {
			return nil
		}
		m, err := Build(cpu.New(1), &Folder{Dir: ck.Dir(), Config: c, Generation: &GenerationConfig{}, Checkpoint: ck}, Options{})
		if err != nil {
			return nil
		}
		st, err := m.NewState(4)
		if err != nil {
			return nil
		}
		out, _ := m.Forward(context.Background(), st, []int32{1, 2}, false)
		return out
	}
	seed, _ := json.Marshal(cfg)
	if len(seed) > maxConfigSeed {
		want := logits(cfg)
		if want == nil {
			t.Fatalf("%s: the config does not build", ck.Dir())
		}
		for _, k := range slices.Sorted(maps.Keys(cfg)) {
			c := maps.Clone(cfg)
			delete(c, k)
			if got := logits(c); got != nil && slices.Equal(got, want) {
				cfg = c
			}
		}
		seed, _ = json.Marshal(cfg)
	}
	if len(seed) > maxConfigSeed {
		t.Fatalf("seed %s: %d bytes, over %d: the fuzzer would spend its time minimizing", seed, len(seed), maxConfigSeed)
	}
	return seed
}

// openCheckpoint opens the checkpoint of the folder dir until the test ends.
func openCheckpoint(t testing.TB, dir string) *weights.Checkpoint {
	t.Helper()
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck
}

// checkConfig builds the weights of checkpoint ck under config, as
// ReadFolder and Build would from a folder holding both, and returns what is
// wrong with the outcome ("" when nothing is): FuzzConfig's rule.
func checkConfig(t *testing.T, ck *weights.Checkpoint, config []byte) string {
	path := filepath.Join(ck.Dir(), "config.json")
	cfg, err := ParseConfig(path, config)
	var m Model
	if err == nil {
		m, err = Build(cpu.New(1), &Folder{Dir: ck.Dir(), Config: cfg, Generation: &GenerationConfig{}, Checkpoint: ck}, Options{})
	}
	if err != nil {
		if msg := err.Error(); !strings.Contains(msg, "config.json") && !strings.Contains(msg, ck.Dir()) {
			return fmt.Sprintf("error names neither config.json nor the checkpoint: %v", err)
		}
		return ""
	}
	st, err := m.NewState(4)
	if err != nil {
		return "" // a config the architecture cannot hold a context for says so here
	}
	logits, err := m.Forward(context.Background(), st, []int32{1, 2}, false)
	if err != nil {
		return fmt.Sprintf("forward of a loaded model: %v", err)
	}
	if len(logits) != m.Config().VocabSize {
		return fmt.Sprintf("%d logits for a vocabulary of %d", len(logits), m.Config().VocabSize)
	}
	for i, v := range logits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Sprintf("logit %d is %g: the config should have been refused", i, v)
		}
	}
	return ""
}
