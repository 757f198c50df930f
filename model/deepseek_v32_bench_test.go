package model

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// benchV32Config is a DeepSeek-V3.2-shaped model scaled down to fit a
// benchmark: V3.2's own per-head sizes (nope 128, rope 64, v 128, latent 512,
// indexer heads of 128, index_topk 2048) with 32 attention heads instead of
// 128, hidden 1024 and two layers (one dense, one MoE).
func benchV32Config() map[string]any {
	return map[string]any{
		"architectures": []string{"DeepseekV32ForCausalLM"}, "model_type": "deepseek_v32", "dtype": "bfloat16",
		"hidden_size": 1024, "intermediate_size": 2816, "moe_intermediate_size": 256,
		"num_hidden_layers": 2, "first_k_dense_replace": 1, "num_attention_heads": 32, "num_key_value_heads": 32,
		"q_lora_rank": 512, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
		"index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
		"n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "n_shared_experts": 1,
		"norm_topk_prob": true, "routed_scaling_factor": 2.5, "vocab_size": 4096, "max_position_embeddings": 163840,
		"rms_norm_eps": 1e-6, "tie_word_embeddings": false, "hidden_act": "silu",
		"rope_parameters": map[string]any{"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
			"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
	}
}

// writeBenchV32 writes the model of cfg with random bf16 weights into dir.
func writeBenchV32(tb testing.TB, dir string, c map[string]any) {
	tb.Helper()
	data, err := json.Marshal(c)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		tb.Fatal(err)
	}
	n := func(k string) int { return int(c[k].(int)) }
	H, heads, V := n("hidden_size"), n("num_attention_heads"), n("vocab_size")
	qr, kr := n("q_lora_rank"), n("kv_lora_rank")
	nope, rope, vd := n("qk_nope_head_dim"), n("qk_rope_head_dim"), n("v_head_dim")
	ih, id := n("index_n_heads"), n("index_head_dim")
	E, I, IE := n("n_routed_experts"), n("intermediate_size"), n("moe_intermediate_size")

	w, err := weights.Create(filepath.Join(dir, "model.safetensors"), map[string]string{"format": "pt"})
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	add := func(name string, scale, offset float32, shape ...int) {
		count := 1
		for _, d := range shape {
			count *= d
		}
		f := make([]float32, count)
		for i := range f {
			f[i] = offset + scale*(rng.Float32()*2-1)
		}
		buf := make([]byte, 2*count)
		quant.EncodeBF16(buf, f)
		if err := w.Add(name, weights.BF16, shape, buf); err != nil {
			tb.Fatal(err)
		}
	}
	const s = 0.05
	add("model.embed_tokens.weight", 1, 0, V, H)
	add("lm_head.weight", s, 0, V, H)
	add("model.norm.weight", 0.1, 1, H)
	for l := range n("num_hidden_layers") {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", 0.1, 1, H)
		add(p+"post_attention_layernorm.weight", 0.1, 1, H)
		add(p+"self_attn.q_a_proj.weight", s, 0, qr, H)
		add(p+"self_attn.q_a_layernorm.weight", 0.1, 1, qr)
		add(p+"self_attn.q_b_proj.weight", s, 0, heads*(nope+rope), qr)
		add(p+"self_attn.kv_a_proj_with_mqa.weight", s, 0, kr+rope, H)
		add(p+"self_attn.kv_a_layernorm.weight", 0.1, 1, kr)
		add(p+"self_attn.kv_b_proj.weight", s, 0, heads*(nope+vd), kr)
		add(p+"self_attn.o_proj.weight", s, 0, H, heads*vd)
		add(p+"self_attn.indexer.wq_b.weight", s, 0, ih*id, qr)
		add(p+"self_attn.indexer.wk.weight", s, 0, id, H)
		add(p+"self_attn.indexer.k_norm.weight", 0.1, 1, id)
		add(p+"self_attn.indexer.k_norm.bias", 0.1, 0, id)
		add(p+"self_attn.indexer.weights_proj.weight", s, 0, ih, H)
		mlp := func(prefix string, width int) {
			add(prefix+"gate_proj.weight", s, 0, width, H)
			add(prefix+"up_proj.weight", s, 0, width, H)
			add(prefix+"down_proj.weight", s, 0, H, width)
		}
		if l < n("first_k_dense_replace") {
			mlp(p+"mlp.", I)
			continue
		}
		add(p+"mlp.gate.weight", s, 0, E, H)
		add(p+"mlp.gate.e_score_correction_bias", 0.01, 0, E)
		for e := range E {
			mlp(fmt.Sprintf("%smlp.experts.%d.", p, e), IE)
		}
		mlp(p+"mlp.shared_experts.", IE*n("n_shared_experts"))
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
}

// fillV32Cache puts ctx positions of random cache entries into st, as if a
// prompt of that length had been prefilled.
func fillV32Cache(m *DeepseekV32, st *v32State, ctx int, rng *rand.Rand) {
	fill := func(buf interface{ Len() int }, width int) {
		v := make([]float32, ctx*width)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		m.b.Write(buf.(cpu.Buffer), 0, v)
	}
	a := m.mla
	for l := range m.cfg.NumLayers {
		fill(st.kr[l], a.RopeDim)
		fill(st.ik[l], m.ixs.HeadDim)
		if st.lat != nil {
			fill(st.lat[l], a.KVLoraRank)
		} else {
			fill(st.kv[l], a.Heads*(a.NopeDim+a.VDim))
		}
	}
	st.n = ctx
}

// BenchmarkDeepseekV32Decode times one decoding step (one token through the
// whole model, logits included) at a given context length, on the naive MLA
// path (expanded per-head K/V cache, as the reference) and on the absorbed
// one (latent + rope key cache), for the V3.2-shaped model of
// benchV32Config. The caches are filled with random entries instead of a
// prefill; each step is rewound so the context stays fixed.
//
//	go test ./model -run '^$' -bench DeepseekV32Decode -benchtime 20x
func BenchmarkDeepseekV32Decode(b *testing.B) {
	dir := b.TempDir()
	cfgMap := benchV32Config()
	writeBenchV32(b, dir, cfgMap)
	mod, err := loadV32(b, dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, ctx := range []int{1024, 8192} {
		for _, path := range []MLAPath{MLANaive, MLAAbsorbed} {
			b.Run(fmt.Sprintf("ctx=%d/%v", ctx, path), func(b *testing.B) {
				st, err := mod.NewStateWith(ctx+1, path)
				if err != nil {
					b.Fatal(err)
				}
				s := st.(*v32State)
				fillV32Cache(mod, s, ctx, rand.New(rand.NewPCG(uint64(ctx), 1)))
				tok := []int32{1}
				bg := context.Background()
				for b.Loop() {
					s.Truncate(ctx)
					if _, err := mod.Forward(bg, s, tok, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(st.CacheBytesPerToken()), "cacheB/token")
			})
		}
	}
}
