// Package testmodel writes small (or benchmark-sized) Llama-shape checkpoints
// with seeded random weights, for tests and benchmarks that need a model
// folder without fixtures. It is never used by the engine itself.
package testmodel

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// Writer is a spec that writes a checkpoint folder: Llama, DeepseekV4, Spec.
type Writer interface {
	Write(dir string) error
}

// TB is what WriteTemp needs of a test or benchmark; testing.TB has it.
type TB interface {
	Helper()
	TempDir() string
	Fatal(args ...any)
}

// WriteTemp writes w to a new temporary folder of tb and returns the
// folder, failing tb on an error.
func WriteTemp(tb TB, w Writer) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := w.Write(dir); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// Llama describes a Llama-shape model, or with Qwen3 set a Qwen3-shape one
// (per-head RMSNorm of q and k).
type Llama struct {
	Layers, Hidden, FFN, Heads, KVHeads, Vocab int
	HeadDim                                    int           // 0: Hidden / Heads
	Theta                                      float64       // rope_theta; 0: 500000
	Qwen3                                      bool          // model_type qwen3, with q_norm and k_norm
	DType                                      weights.DType // F32 or BF16: embeddings, norms, LM head, and linears unless NVFP4
	NVFP4                                      bool          // linears as random NVFP4 codes in ModelOpt's layout
	Seed                                       uint64
}

func (l Llama) headDim() int {
	if l.HeadDim > 0 {
		return l.HeadDim
	}
	return l.Hidden / l.Heads
}

// Config is the config.json Write writes.
func (l Llama) Config() ([]byte, error) {
	hd := l.headDim()
	theta := l.Theta
	if theta == 0 {
		theta = 500000
	}
	arch, typ, dtype, eps := "LlamaForCausalLM", "llama", "float32", 1e-5
	if l.Qwen3 {
		arch, typ, eps = "Qwen3ForCausalLM", "qwen3", 1e-6
	}
	if l.DType == weights.BF16 {
		dtype = "bfloat16"
	}
	cfg := map[string]any{
		"architectures": []string{arch}, "model_type": typ,
		"hidden_size": l.Hidden, "intermediate_size": l.FFN, "num_hidden_layers": l.Layers,
		"num_attention_heads": l.Heads, "num_key_value_heads": l.KVHeads, "head_dim": hd,
		"vocab_size": l.Vocab, "max_position_embeddings": 40960, "rms_norm_eps": eps,
		"rope_theta": theta, "tie_word_embeddings": false, "hidden_act": "silu",
		"bos_token_id": 0, "eos_token_id": 1, "dtype": dtype,
	}
	if l.Qwen3 {
		cfg["attention_bias"] = false
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// Write creates dir/config.json and dir/model.safetensors (and
// dir/hf_quant_config.json when NVFP4). config.json is written last, so a
// folder holding it holds a whole checkpoint.
func (l Llama) Write(dir string) error { return l.WriteProgress(dir, nil) }

// WriteProgress is Write, calling progress (when not nil) after each tensor
// with the tensor bytes added so far and CheckpointBytes. The last call
// (done == total) comes before the file is finished (its data copied behind
// the header). An error from progress stops the write and is returned;
// config.json is then not written.
func (l Llama) WriteProgress(dir string, progress func(done, total int64) error) error {
	hd := l.headDim()
	cfg, err := l.Config()
	if err != nil {
		return err
	}
	// A config.json left from an earlier checkpoint would make this folder
	// look whole while it is being rewritten.
	if err := os.Remove(filepath.Join(dir, "config.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if l.NVFP4 {
		q := `{"producer": {"name": "manifold-testmodel"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}`
		if err := os.WriteFile(filepath.Join(dir, "hf_quant_config.json"), []byte(q), 0o644); err != nil {
			return err
		}
	} else if err := os.Remove(filepath.Join(dir, "hf_quant_config.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err // one left from an NVFP4 checkpoint would mislabel this one
	}
	var done int64
	total := l.CheckpointBytes()
	var stopped error // progress's error: the tensors after it are skipped
	added := func(n int) {
		done += int64(n)
		if progress != nil && stopped == nil {
			stopped = progress(done, total)
		}
	}
	w, err := weights.Create(filepath.Join(dir, "model.safetensors"), map[string]string{"format": "pt"})
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(l.Seed, 1))
	add := func(name string, shape []int, scale float64, around float64) error {
		if stopped != nil {
			return stopped
		}
		n := 1
		for _, d := range shape {
			n *= d
		}
		size := l.DType.Size()
		buf := make([]byte, n*size)
		for i := 0; i < n; i++ {
			v := float32(around + scale*rng.NormFloat64())
			if size == 4 {
				binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
			} else {
				binary.LittleEndian.PutUint16(buf[2*i:], quant.Float32ToBF16(v))
			}
		}
		added(len(buf))
		return w.Add(name, l.DType, shape, buf)
	}
	lin := func(name string, out, in int) error {
		if stopped != nil {
			return stopped
		}
		if !l.NVFP4 {
			return add(name+".weight", []int{out, in}, 1/math.Sqrt(float64(in)), 0)
		}
		packed := make([]byte, out*in/2)
		for i := 0; i+8 <= len(packed); i += 8 {
			binary.LittleEndian.PutUint64(packed[i:], rng.Uint64())
		}
		scales := make([]byte, out*in/16)
		for i := range scales {
			scales[i] = quant.Float32ToE4M3(float32(0.5 + rng.Float64())) // block maxima near 6 × 1
		}
		global := make([]byte, 4)
		binary.LittleEndian.PutUint32(global, math.Float32bits(float32(1/(6*math.Sqrt(float64(in))))))
		added(len(packed) + len(scales) + len(global))
		return errors.Join(
			w.Add(name+".weight", weights.U8, []int{out, in / 2}, packed),
			w.Add(name+".weight_scale", weights.F8E4M3, []int{out, in / 16}, scales),
			w.Add(name+".weight_scale_2", weights.F32, []int{}, global))
	}
	must := []error{
		add("model.embed_tokens.weight", []int{l.Vocab, l.Hidden}, 1, 0),
		add("model.norm.weight", []int{l.Hidden}, 0.05, 1),
		add("lm_head.weight", []int{l.Vocab, l.Hidden}, 1/math.Sqrt(float64(l.Hidden)), 0), // kept dense, as cmd/convert does
	}
	for i := 0; i < l.Layers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		must = append(must,
			add(p+"input_layernorm.weight", []int{l.Hidden}, 0.05, 1),
			add(p+"post_attention_layernorm.weight", []int{l.Hidden}, 0.05, 1),
			lin(p+"self_attn.q_proj", l.Heads*hd, l.Hidden),
			lin(p+"self_attn.k_proj", l.KVHeads*hd, l.Hidden),
			lin(p+"self_attn.v_proj", l.KVHeads*hd, l.Hidden),
			lin(p+"self_attn.o_proj", l.Hidden, l.Heads*hd),
			lin(p+"mlp.gate_proj", l.FFN, l.Hidden),
			lin(p+"mlp.up_proj", l.FFN, l.Hidden),
			lin(p+"mlp.down_proj", l.Hidden, l.FFN),
		)
		if l.Qwen3 {
			must = append(must,
				add(p+"self_attn.q_norm.weight", []int{hd}, 0.05, 1),
				add(p+"self_attn.k_norm.weight", []int{hd}, 0.05, 1))
		}
	}
	if stopped != nil {
		must = append(must, stopped)
	}
	for _, err := range must {
		if err != nil {
			w.Close()
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644)
}

// CheckpointBytes is the size of the tensor data Write writes.
func (l Llama) CheckpointBytes() int64 {
	hd := int64(l.headDim())
	H, F, V, size := int64(l.Hidden), int64(l.FFN), int64(l.Vocab), int64(l.DType.Size())
	linear := func(out, in int64) int64 {
		if l.NVFP4 {
			return out*in/2 + out*in/16 + 4
		}
		return out * in * size
	}
	per := 2*H*size + linear(int64(l.Heads)*hd, H) + 2*linear(int64(l.KVHeads)*hd, H) + linear(H, int64(l.Heads)*hd) +
		2*linear(F, H) + linear(H, F)
	if l.Qwen3 {
		per += 2 * hd * size
	}
	return 2*V*H*size + H*size + int64(l.Layers)*per
}

// WeightBytes is the size of the weights a decode step reads (all but the
// embedding table, of which one row is read): the linears (with their block
// scales when NVFP4) and the LM head.
func (l Llama) WeightBytes() int64 {
	hd := l.headDim()
	per := int64(l.Hidden*(l.Heads*hd)*2 + l.Hidden*(l.KVHeads*hd)*2 + 3*l.Hidden*l.FFN)
	linear := float64(per*int64(l.Layers)) * float64(l.DType.Size())
	if l.NVFP4 {
		linear = float64(per*int64(l.Layers)) * (0.5 + 1.0/16)
	}
	return int64(linear) + int64(l.Vocab*l.Hidden*l.DType.Size())
}

// Rewrite copies the checkpoint folder src (its config.json and single
// model.safetensors) to dst, passing each tensor through edit, which returns
// the tensor to write in its place (nil: none): tests of what the engine
// does with a damaged or mislabelled weight.
func Rewrite(src, dst string, edit func(t *weights.Tensor) *weights.Tensor) error {
	return RewriteTensors(src, dst, func(_ *weights.Checkpoint, t *weights.Tensor) []*weights.Tensor {
		if t = edit(t); t == nil {
			return nil
		}
		return []*weights.Tensor{t}
	})
}
