package model

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// tinyModel writes a small random Llama and returns its folder.
func tinyModel(t *testing.T) string {
	dir := t.TempDir()
	spec := testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 4, KVHeads: 2, Vocab: 50, DType: weights.F32, Seed: 1}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// editConfig rewrites one field of dir/config.json (nil deletes it).
func editConfig(t *testing.T, dir, field string, value any) {
	path := filepath.Join(dir, "config.json")
	data, _ := os.ReadFile(path)
	var m map[string]any
	json.Unmarshal(data, &m)
	if value == nil {
		delete(m, field)
	} else {
		m[field] = value
	}
	data, _ = json.Marshal(m)
	os.WriteFile(path, data, 0o644)
}

func load(dir string) (Model, error) {
	_, m, err := Open(dir, cpu.New(1), Options{})
	return m, err
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(t *testing.T, dir string)
		wants []string // substrings of the error
	}{
		{"unknown architecture", func(t *testing.T, d string) { editConfig(t, d, "model_type", "gpt9") },
			[]string{`"model_type"`, "gpt9", "llama", "qwen3"}},
		{"missing model_type", func(t *testing.T, d string) { editConfig(t, d, "model_type", nil) },
			[]string{`"model_type"`, "missing"}},
		{"bad head count", func(t *testing.T, d string) { editConfig(t, d, "num_key_value_heads", 3) },
			[]string{`"num_key_value_heads"`}},
		{"config disagrees with weights", func(t *testing.T, d string) { editConfig(t, d, "intermediate_size", 64) },
			[]string{"mlp.gate_proj.weight", "[48 32]", "[64 32]"}},
		{"unsupported rope", func(t *testing.T, d string) {
			editConfig(t, d, "rope_parameters", map[string]any{"rope_type": "longrope", "rope_theta": 10000})
		}, []string{"rope_parameters", "longrope"}},
		{"missing config", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "config.json")) },
			[]string{"config.json"}},
		{"config not JSON", func(t *testing.T, d string) { os.WriteFile(filepath.Join(d, "config.json"), []byte("{"), 0o644) },
			[]string{"config.json"}},
		{"missing tensor", func(t *testing.T, d string) { editConfig(t, d, "num_hidden_layers", 3) },
			[]string{"model.layers.2.", weights.ErrMissingTensor.Error()}},
		{"unsupported activation", func(t *testing.T, d string) { editConfig(t, d, "hidden_act", "gelu") },
			[]string{`"hidden_act"`, "gelu"}},
		{"negative norm epsilon", func(t *testing.T, d string) { editConfig(t, d, "rms_norm_eps", -1e-5) },
			[]string{`"rms_norm_eps"`, "config.json"}},
		{"more layers than tensors", func(t *testing.T, d string) { editConfig(t, d, "num_hidden_layers", 1_000_000_000) },
			[]string{`"num_hidden_layers"`, "config.json", "tensors"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tinyModel(t)
			tc.edit(t, dir)
			_, err := load(dir)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestWrongDTypeWeight(t *testing.T) {
	dir := t.TempDir()
	err := testmodel.Rewrite(tinyModel(t), dir, func(tn *weights.Tensor) *weights.Tensor {
		if tn.Name == "model.layers.0.self_attn.q_proj.weight" {
			tn.DType = weights.I32 // same byte size, wrong kind
		}
		return tn
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = load(dir)
	if err == nil || !strings.Contains(err.Error(), "q_proj.weight") || !strings.Contains(err.Error(), "I32") {
		t.Fatalf("error %v does not name the tensor and dtype", err)
	}
}

func TestForwardErrors(t *testing.T) {
	m, err := load(tinyModel(t))
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.NewState(4)
	ctx := context.Background()
	if _, err := m.Forward(ctx, st, []int32{1, 2, 3, 4, 5}, false); err == nil || !strings.Contains(err.Error(), "context") {
		t.Errorf("overflow: %v", err)
	}
	if _, err := m.Forward(ctx, st, []int32{50}, false); err == nil || !strings.Contains(err.Error(), "vocabulary") {
		t.Errorf("token past vocab: %v", err)
	}
	if _, err := m.Forward(ctx, st, nil, false); err == nil {
		t.Error("empty forward accepted")
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Forward(cancelled, st, []int32{1}, false); !errors.Is(err, context.Canceled) || st.Len() != 0 {
		t.Errorf("cancelled forward: %v, len %d", err, st.Len())
	}
}

func TestGenerationConfig(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id":[1,7],"temperature":0.6,"top_p":0.9,"do_sample":true}`), 0o644)
	g, err := LoadGenerationConfig(dir)
	if err != nil || len(g.EOSTokenIDs) != 2 || g.EOSTokenIDs[1] != 7 || g.TopP != 0.9 || !g.DoSample {
		t.Fatalf("%+v %v", g, err)
	}
	os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id":"x"}`), 0o644)
	if _, err := LoadGenerationConfig(dir); err == nil || !strings.Contains(err.Error(), "eos_token_id") {
		t.Errorf("bad eos: %v", err)
	}
}
