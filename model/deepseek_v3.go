package model

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
)

// DeepSeek-V3, R1 and V3.1 (model_type deepseek_v3) are DeepSeek-V3.2
// without the lightning indexer: multi-head latent attention over every
// earlier token, the first first_k_dense_replace layers with a dense SwiGLU
// MLP and the rest with the DeepSeek-V3 mixture of experts (sigmoid scores,
// e_score_correction_bias for the choice only, group-limited top-k with
// n_group and topk_group, weights normalized and scaled by
// routed_scaling_factor, shared experts). They run as a DeepseekV32 built
// without its indexer, whose states attend through Backend.Attention: in
// the latent space by default (one shared key head [latent, k_rope] a
// token, the query heads absorbed with W_UK, the outputs expanded with W_UV:
// KVLoraRank+RopeDim cached values a token and layer), or with MLADense on
// the expanded per-head keys and values. Every backend runs them with its
// core ops and the absorption ops of backend.SparseMLAOps (MLADense needs
// only the core ops), the routed experts on the device where
// backend.GroupMoEOps takes them. The released checkpoints store
// their linears as FP8 E4M3 with a float32 weight_scale_inv per 128x128
// block; bf16 and float32 checkpoints load as well.
func newDeepseekV3(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	if o.Attention.Kind == "htree" {
		return nil, fmt.Errorf("model: %s does not support htree attention (llama and qwen3 do)", cfg.ModelType)
	}
	return loadDeepseekV32(b, cfg, l, false, o.MTP)
}
