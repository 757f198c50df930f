package testmodel

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// The released mixture-of-experts layouts of issue 58: DeepSeek-V3 (and R1,
// V3.1) with FP8 E4M3 linears scaled by a float32 weight_scale_inv per
// 128x128 block, and Qwen3-MoE in bf16, both with one module per expert
// (mlp.experts.N.gate_proj, ...) as the released checkpoints name them.

func init() {
	shapes["deepseek-v3-2l"] = Spec{Description: "two layers of DeepSeek-V3 as released (hidden 7168, 128 MLA heads, a dense layer then a MoE layer of 256 experts of 2048, top 8 of 8 groups, vocab 129280): FP8 E4M3 linears with F32 weight_scale_inv per 128x128, bf16 the rest",
		Model: DeepseekV3{Layers: 2, DenseLayers: 1, FP8: true, Seed: 1}}
	shapes["qwen3-30b-a3b"] = Spec{Description: "Qwen3-30B-A3B as released: 48 layers, hidden 2048, GQA 32/4 (heads of 128) with q/k norms, 128 experts of 768, top 8, vocab 151936; bf16",
		Model: Qwen3MoE{Seed: 1}}
	shapes["qwen3-30b-a3b-2l"] = Spec{Description: "two layers of Qwen3-30B-A3B as released (hidden 2048, 128 experts of 768, top 8, vocab 151936); bf16",
		Model: Qwen3MoE{Layers: 2, Seed: 1}}
}

// DeepseekV3 describes a DeepSeek-V3-shape model (model_type deepseek_v3):
// MLA attention, the first DenseLayers layers with a dense SwiGLU MLP, the
// rest with group-routed experts and shared experts. With FP8 every linear
// but the router is F8_E4M3 with a weight_scale_inv F32 [ceil(out/128),
// ceil(in/128)] and config.json carries the released quantization_config;
// otherwise the linears are bf16. Embeddings, LM head, norms and router are
// bf16, the router's e_score_correction_bias f32. A zero field takes
// DeepSeek-V3's released value (61 layers, 3 dense).
type DeepseekV3 struct {
	Layers, DenseLayers       int
	Hidden, FFN, Heads, Vocab int
	QLora, KVLora             int
	Nope, Rope, VDim          int
	Experts, Shared, TopK     int
	MoEFFN                    int
	Groups, TopKGroups        int
	FP8                       bool
	// MTP adds DeepSeek's multi-token-prediction layer,
	// model.layers.<Layers>.* (a MoE decoder layer with enorm, hnorm,
	// eh_proj and shared_head), as the released checkpoints carry it.
	MTP  bool
	Seed uint64
}

func (d DeepseekV3) withDefaults() DeepseekV3 {
	fillInts([]*int{&d.Layers, &d.DenseLayers, &d.Hidden, &d.FFN, &d.Heads, &d.Vocab, &d.QLora, &d.KVLora, &d.Nope,
		&d.Rope, &d.VDim, &d.Experts, &d.Shared, &d.TopK, &d.MoEFFN, &d.Groups, &d.TopKGroups},
		61, 3, 7168, 18432, 128, 129280, 1536, 512, 128, 64, 128, 256, 1, 8, 2048, 8, 4)
	return d
}

// fillInts sets each zero *ptrs[i] to vals[i].
func fillInts(ptrs []*int, vals ...int) {
	for i, p := range ptrs {
		if *p == 0 {
			*p = vals[i]
		}
	}
}

// routed is the number of routed experts and of those a token picks.
func (d DeepseekV3) routed() (experts, k int) { d = d.withDefaults(); return d.Experts, d.TopK }

// fp8Block is the released block of DeepSeek-V3's weight_scale_inv.
const fp8Block = 128

// Config is the config.json Write writes: DeepSeek-V3's released fields.
func (d DeepseekV3) Config() ([]byte, error) {
	d = d.withDefaults()
	cfg := map[string]any{
		"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3",
		"hidden_size": d.Hidden, "intermediate_size": d.FFN, "num_hidden_layers": d.Layers,
		"num_attention_heads": d.Heads, "num_key_value_heads": d.Heads, "vocab_size": d.Vocab,
		"q_lora_rank": d.QLora, "kv_lora_rank": d.KVLora, "qk_nope_head_dim": d.Nope, "qk_rope_head_dim": d.Rope,
		"v_head_dim": d.VDim, "n_routed_experts": d.Experts, "n_shared_experts": d.Shared,
		"num_experts_per_tok": d.TopK, "moe_intermediate_size": d.MoEFFN, "n_group": d.Groups, "topk_group": d.TopKGroups,
		"first_k_dense_replace": d.DenseLayers, "moe_layer_freq": 1, "norm_topk_prob": true,
		"routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
		"hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000,
		"rope_scaling": map[string]any{"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1,
			"mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
		"tie_word_embeddings": false, "attention_bias": false, "torch_dtype": "bfloat16",
		"bos_token_id": 0, "eos_token_id": 1,
	}
	if d.MTP {
		cfg["num_nextn_predict_layers"] = 1
	}
	if d.FP8 {
		cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3",
			"weight_block_size": []int{fp8Block, fp8Block}, "activation_scheme": "dynamic"}
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// moeTensors collects a checkpoint's tensors in order.
type moeTensors struct {
	g   v4Gen
	out []v4Tensor
}

func (m *moeTensors) dense(name string, dtype weights.DType, mean, std float64, count v4Count, shape ...int) {
	n := 1
	for _, s := range shape {
		n *= s
	}
	g := m.g
	m.out = append(m.out, v4Tensor{name: name, dtype: dtype, shape: shape, count: count,
		make: func() []byte { return g.normal(name, dtype, n, mean, std) }})
}

// linear adds module.weight [rows, cols]: dtype values of norm about 1 a
// row, or with fp8 E4M3 codes of N(0, 1) and a weight_scale_inv near
// 1/sqrt(cols) a block.
func (m *moeTensors) linear(module string, dtype weights.DType, fp8 bool, count v4Count, rows, cols int) {
	std := 1 / math.Sqrt(float64(cols))
	if !fp8 {
		m.dense(module+".weight", dtype, 0, std, count, rows, cols)
		return
	}
	name, g := module+".weight", m.g
	m.out = append(m.out, v4Tensor{name: name, dtype: weights.F8E4M3, shape: []int{rows, cols}, count: count,
		make: func() []byte { return g.e4m3Normal(name, rows*cols) }})
	m.dense(module+".weight_scale_inv", weights.F32, std, std/5, count,
		(rows+fp8Block-1)/fp8Block, (cols+fp8Block-1)/fp8Block)
}

// e4m3Normal is n E4M3 codes of N(0, 1): random bytes through a table of
// the normal's 256 quantiles.
func (g v4Gen) e4m3Normal(name string, n int) []byte {
	var table [256]byte
	for i := range table {
		z := math.Sqrt2 * math.Erfinv(2*(float64(i)+0.5)/256-1)
		table[i] = quant.Float32ToE4M3(float32(z))
	}
	buf := g.bytes(name, n)
	for i, b := range buf {
		buf[i] = table[b]
	}
	return buf
}

// swiglu adds the gate, up and down projections of a SwiGLU MLP of width
// ffn under prefix.
func (m *moeTensors) swiglu(prefix string, dtype weights.DType, fp8 bool, count v4Count, ffn, hidden int) {
	m.linear(prefix+"gate_proj", dtype, fp8, count, ffn, hidden)
	m.linear(prefix+"up_proj", dtype, fp8, count, ffn, hidden)
	m.linear(prefix+"down_proj", dtype, fp8, count, hidden, ffn)
}

// decoderTensors lists a HuggingFace-layout decoder's tensors: the
// embedding table, the final norm and the LM head (bf16), then for each
// layer its two norms (in dtype) and what layer adds (p is the layer's
// prefix, a its attention's).
func decoderTensors(seed uint64, vocab, hidden, layers int, dtype weights.DType, layer func(m *moeTensors, l int, p, a string)) []v4Tensor {
	m := &moeTensors{g: v4Gen{seed: seed}}
	m.dense("model.embed_tokens.weight", weights.BF16, 0, 1, countNever, vocab, hidden)
	m.dense("model.norm.weight", weights.BF16, 1, 0.05, countAlways, hidden)
	m.dense("lm_head.weight", weights.BF16, 0, 1/math.Sqrt(float64(hidden)), countAlways, vocab, hidden)
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		m.dense(p+"input_layernorm.weight", dtype, 1, 0.05, countAlways, hidden)
		m.dense(p+"post_attention_layernorm.weight", dtype, 1, 0.05, countAlways, hidden)
		layer(m, l, p, p+"self_attn.")
	}
	return m.out
}

// experts adds a layer's router (mlp.gate, in dtype) and its routed
// experts.
func (m *moeTensors) experts(p string, dtype weights.DType, fp8 bool, experts, ffn, hidden int) {
	m.dense(p+"mlp.gate.weight", dtype, 0, 1/math.Sqrt(float64(hidden)), countAlways, experts, hidden)
	for e := range experts {
		m.swiglu(fmt.Sprintf("%smlp.experts.%d.", p, e), dtype, fp8, countExpert, ffn, hidden)
	}
}

func (d DeepseekV3) tensors() []v4Tensor {
	d = d.withDefaults()
	H, bf := d.Hidden, weights.BF16
	layers := d.Layers
	if d.MTP {
		layers++
	}
	return decoderTensors(d.Seed, d.Vocab, H, layers, bf, func(m *moeTensors, l int, p, a string) {
		if l == d.Layers { // the MTP layer's own tensors
			m.dense(p+"enorm.weight", bf, 1, 0.05, countNever, H)
			m.dense(p+"hnorm.weight", bf, 1, 0.05, countNever, H)
			m.linear(p+"eh_proj", bf, d.FP8, countNever, H, 2*H)
			m.dense(p+"shared_head.norm.weight", bf, 1, 0.05, countNever, H)
			m.dense(p+"shared_head.head.weight", bf, 0, 1/math.Sqrt(float64(H)), countNever, d.Vocab, H)
		}
		m.linear(a+"q_a_proj", bf, d.FP8, countAlways, d.QLora, H)
		m.dense(a+"q_a_layernorm.weight", bf, 1, 0.05, countAlways, d.QLora)
		m.linear(a+"q_b_proj", bf, d.FP8, countAlways, d.Heads*(d.Nope+d.Rope), d.QLora)
		m.linear(a+"kv_a_proj_with_mqa", bf, d.FP8, countAlways, d.KVLora+d.Rope, H)
		m.dense(a+"kv_a_layernorm.weight", bf, 1, 0.05, countAlways, d.KVLora)
		m.linear(a+"kv_b_proj", bf, d.FP8, countAlways, d.Heads*(d.Nope+d.VDim), d.KVLora)
		m.linear(a+"o_proj", bf, d.FP8, countAlways, H, d.Heads*d.VDim)
		if l < d.DenseLayers {
			m.swiglu(p+"mlp.", bf, d.FP8, countAlways, d.FFN, H)
			return
		}
		m.dense(p+"mlp.gate.e_score_correction_bias", weights.F32, 0, 0.05, countNever, d.Experts)
		m.experts(p, bf, d.FP8, d.Experts, d.MoEFFN, H)
		m.swiglu(p+"mlp.shared_experts.", bf, d.FP8, countAlways, d.MoEFFN*d.Shared, H)
	})
}

// The Model methods (see Model): the tensors are written one after the
// other (writeTensors), and a decode step reads all but the embedding table,
// the host-side router bias and the unselected routed experts (stepBytes).
func (d DeepseekV3) Write(dir string) error { return writeTensors(d, d.tensors(), dir, nil) }
func (d DeepseekV3) WriteProgress(dir string, p func(done, total int64) error) error {
	return writeTensors(d, d.tensors(), dir, p)
}
func (d DeepseekV3) WeightBytes() int64     { return stepBytes(d) }
func (d DeepseekV3) CheckpointBytes() int64 { return tensorBytes(d.tensors()) }

// Qwen3MoE describes a Qwen3-MoE-shape model (model_type qwen3_moe): Qwen3
// attention (q/k norms) and on every layer a softmax-routed mixture of
// SwiGLU experts, all in DType (bf16, as released, when zero). A zero field
// takes Qwen3-30B-A3B's released value.
type Qwen3MoE struct {
	Layers, Hidden, Heads, KVHeads, HeadDim, Vocab int
	FFN, Experts, TopK, MoEFFN                     int
	Theta                                          float64
	DType                                          weights.DType
	Seed                                           uint64
}

func (q Qwen3MoE) withDefaults() Qwen3MoE {
	fillInts([]*int{&q.Layers, &q.Hidden, &q.Heads, &q.KVHeads, &q.HeadDim, &q.Vocab, &q.FFN, &q.Experts, &q.TopK, &q.MoEFFN},
		48, 2048, 32, 4, 128, 151936, 6144, 128, 8, 768)
	if q.Theta == 0 {
		q.Theta = 1e6
	}
	if q.DType == 0 {
		q.DType = weights.BF16
	}
	return q
}

func (q Qwen3MoE) routed() (experts, k int) { q = q.withDefaults(); return q.Experts, q.TopK }

// Config is the config.json Write writes: Qwen3-30B-A3B's released fields.
func (q Qwen3MoE) Config() ([]byte, error) {
	q = q.withDefaults()
	dtype := "bfloat16"
	if q.DType == weights.F32 {
		dtype = "float32"
	}
	return json.MarshalIndent(map[string]any{
		"architectures": []string{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe",
		"hidden_size": q.Hidden, "intermediate_size": q.FFN, "num_hidden_layers": q.Layers,
		"num_attention_heads": q.Heads, "num_key_value_heads": q.KVHeads, "head_dim": q.HeadDim, "vocab_size": q.Vocab,
		"num_experts": q.Experts, "num_experts_per_tok": q.TopK, "moe_intermediate_size": q.MoEFFN,
		"norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []int{},
		"hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": q.Theta,
		"use_sliding_window": false, "sliding_window": nil, "attention_bias": false,
		"tie_word_embeddings": false, "torch_dtype": dtype, "bos_token_id": 151643, "eos_token_id": 151645,
	}, "", "  ")
}

func (q Qwen3MoE) tensors() []v4Tensor {
	q = q.withDefaults()
	H, dt := q.Hidden, q.DType
	return decoderTensors(q.Seed, q.Vocab, H, q.Layers, dt, func(m *moeTensors, _ int, p, a string) {
		m.linear(a+"q_proj", dt, false, countAlways, q.Heads*q.HeadDim, H)
		m.linear(a+"k_proj", dt, false, countAlways, q.KVHeads*q.HeadDim, H)
		m.linear(a+"v_proj", dt, false, countAlways, q.KVHeads*q.HeadDim, H)
		m.linear(a+"o_proj", dt, false, countAlways, H, q.Heads*q.HeadDim)
		m.dense(a+"q_norm.weight", dt, 1, 0.05, countAlways, q.HeadDim)
		m.dense(a+"k_norm.weight", dt, 1, 0.05, countAlways, q.HeadDim)
		m.experts(p, dt, false, q.Experts, q.MoEFFN, H)
	})
}

// Qwen3MoE's Model methods, as DeepseekV3's.
func (q Qwen3MoE) CheckpointBytes() int64 { return tensorBytes(q.tensors()) }
func (q Qwen3MoE) WeightBytes() int64     { return stepBytes(q) }
func (q Qwen3MoE) Write(dir string) error { return q.WriteProgress(dir, nil) }
func (q Qwen3MoE) WriteProgress(dir string, p func(done, total int64) error) error {
	return writeTensors(q, q.tensors(), dir, p)
}
