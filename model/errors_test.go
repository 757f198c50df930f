package model

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// tinyModel writes a small random Llama and returns its folder.
func tinyModel(t *testing.T) string {
	spec := testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 4, KVHeads: 2, Vocab: 50, DType: weights.F32, Seed: 1}
	dir := testmodel.WriteTemp(t, spec)
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

// TestLoadErrorsClassified damages checkpoints and checks that each error can
// be told apart with errors.Is and errors.As while still naming the file and
// tensor: a tensor whose shape disagrees with the config wraps ErrConfig; a
// tensor of a dtype the engine cannot use is a *weights.Error wrapping
// nvfp4ckpt.ErrUnsupportedDType (a linear weight) or weights.ErrDType (a
// vector).
func TestLoadErrorsClassified(t *testing.T) {
	llama := testmodel.Llama{Layers: 2, Hidden: 32, FFN: 48, Heads: 4, KVHeads: 2, Vocab: 50, DType: weights.F32, Seed: 1}
	v4 := testmodel.DeepseekV4{
		Vocab: 64, Hidden: 32, Layers: 3, Heads: 2, HeadDim: 32, QLora: 32, OGroups: 2, OLora: 16, Window: 4,
		RateCSA: 2, RateHCA: 4, IndexHeads: 2, IndexDim: 16, IndexTopK: 2, HCMult: 2, HCIters: 3,
		Experts: 4, TopK: 2, MoEFFN: 16, RopeDim: 8, HashLayers: 1,
		LayerTypes: []string{testmodel.V4HCA, testmodel.V4CSA, testmodel.V4Sliding}, Seed: 2,
	}
	type writer interface{ Write(string) error }
	nvfp4 := llama
	nvfp4.NVFP4 = true
	qwen3 := llama
	qwen3.Qwen3 = true
	// retype changes a tensor's dtype to one of the same size.
	retype := func(name string, d weights.DType) func(*weights.Tensor) *weights.Tensor {
		return func(tn *weights.Tensor) *weights.Tensor {
			if tn.Name == name {
				tn.DType = d
			}
			return tn
		}
	}
	reshape := func(name string, shape ...int) func(*weights.Tensor) *weights.Tensor {
		return func(tn *weights.Tensor) *weights.Tensor {
			if tn.Name == name {
				tn.Shape = shape
			}
			return tn
		}
	}
	for _, tc := range []struct {
		name   string
		spec   writer
		config map[string]any                        // config.json fields to set
		edit   func(*weights.Tensor) *weights.Tensor // nil: no Rewrite
		is     []error                               // errors.Is targets
		asW    bool                                  // errors.As *weights.Error
		wants  []string                              // substrings
	}{
		{"linear shape", llama, map[string]any{"intermediate_size": 64}, nil,
			[]error{ErrConfig}, false, []string{"model.safetensors", "mlp.gate_proj.weight", "[48 32]", "[64 32]"}},
		{"vector shape", llama, nil, reshape("model.layers.1.input_layernorm.weight", 2, 16),
			[]error{ErrConfig}, false, []string{"model.safetensors", "model.layers.1.input_layernorm.weight", "[2 16]", "[32]"}},
		{"NVFP4 linear shape", nvfp4, map[string]any{"intermediate_size": 64}, nil,
			[]error{ErrConfig}, false, []string{"mlp.gate_proj", "[48, 32]", "[64, 32]"}},
		{"qwen3 without q_norm", qwen3, nil, func(tn *weights.Tensor) *weights.Tensor {
			if strings.Contains(tn.Name, "layers.1.self_attn.q_norm") {
				tn.Name = "unused." + tn.Name
			}
			return tn
		}, []error{ErrConfig, weights.ErrMissingTensor}, false, []string{"layer 1", "q_norm"}},
		{"V4 hash table shape", v4, nil, reshape("model.layers.0.ffn.gate.tid2eid", 64*2),
			[]error{ErrConfig}, false, []string{"model.safetensors", "tid2eid", "[128]", "[64 2]"}},
		{"V4 hash table expert", v4, nil, func(tn *weights.Tensor) *weights.Tensor {
			if tn.Name == "model.layers.0.ffn.gate.tid2eid" {
				tn.Data = slices.Clone(tn.Data)
				tn.Data[0] = 9 // little-endian: the first entry becomes expert 9 of 4
			}
			return tn
		}, []error{ErrConfig}, false, []string{"model.safetensors", "tid2eid", "expert 9"}},
		{"linear dtype", llama, nil, retype("model.layers.0.self_attn.q_proj.weight", weights.I32),
			[]error{nvfp4ckpt.ErrUnsupportedDType}, true, []string{"model.safetensors", "q_proj.weight", "I32"}},
		{"vector dtype", llama, nil, retype("model.norm.weight", weights.I32),
			[]error{weights.ErrDType}, true, []string{"model.safetensors", "model.norm.weight", "I32"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.spec.Write(dir); err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				dst := t.TempDir()
				if err := testmodel.Rewrite(dir, dst, tc.edit); err != nil {
					t.Fatal(err)
				}
				dir = dst
			}
			for f, v := range tc.config {
				editConfig(t, dir, f, v)
			}
			_, err := load(dir)
			if err == nil {
				t.Fatal("loaded")
			}
			for _, target := range tc.is {
				if !errors.Is(err, target) {
					t.Errorf("error %q is not %v", err, target)
				}
			}
			var we *weights.Error
			if errors.As(err, &we) != tc.asW {
				t.Errorf("error %q: errors.As *weights.Error = %v, want %v", err, !tc.asW, tc.asW)
			}
			if !tc.asW && !errors.Is(err, ErrConfig) {
				t.Errorf("error %q wraps neither ErrConfig nor *weights.Error", err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
