package model

import "github.com/manifoldlm/manifold/backend"

// Qwen3 is the Llama decoder with an RMSNorm over each query and key head
// (self_attn.q_norm, self_attn.k_norm) before RoPE, and optional sliding
// window layers (use_sliding_window, layer_types).
func newQwen3(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	return loadLlama(b, cfg, l, o, true, nil)
}
