package model

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// FuzzConfig loads a small random Llama under any config.json: whatever the
// config says, loading either fails with an error (one naming config.json,
// or one naming the checkpoint, for a tensor it lacks or that disagrees) or
// gives a model whose forward pass over two tokens returns finite logits
// of the vocabulary's size. It must never panic or allocate without bound.
func FuzzConfig(f *testing.F) {
	src := f.TempDir()
	spec := testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 4, KVHeads: 2, Vocab: 50, DType: weights.F32, Seed: 1}
	if err := spec.Write(src); err != nil {
		f.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(base)
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
		f.Add([]byte(s))
	}
	weightsPath := filepath.Join(src, "model.safetensors")
	f.Fuzz(func(t *testing.T, config []byte) {
		dir := t.TempDir()
		if err := os.Symlink(weightsPath, filepath.Join(dir, "model.safetensors")); err != nil {
			t.Skip(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), config, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := load(dir)
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, "config.json") && !strings.Contains(msg, dir) {
				t.Fatalf("error names neither config.json nor the checkpoint: %v", err)
			}
			return
		}
		st, err := m.NewState(4)
		if err != nil {
			return // a config the architecture cannot hold a context for says so here
		}
		logits, err := m.Forward(context.Background(), st, []int32{1, 2}, false)
		if err != nil {
			t.Fatalf("forward of a loaded model: %v", err)
		}
		if len(logits) != m.Config().VocabSize {
			t.Fatalf("%d logits for a vocabulary of %d", len(logits), m.Config().VocabSize)
		}
		for i, v := range logits {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("logit %d is %g: the config should have been refused", i, v)
			}
		}
	})
}
