package model

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// Qwen3-MoE (model_type qwen3_moe: Qwen3-30B-A3B, Qwen3-235B-A22B) is the
// Qwen3 decoder whose MLP is, on its sparse layers, a mixture of SwiGLU
// experts: the router (mlp.gate, [num_experts, hidden]) gives each token a
// softmax over the experts, the token goes to the num_experts_per_tok most
// probable, weighted by their probabilities (renormalized to sum 1 when
// norm_topk_prob), with no shared expert. Layer i is sparse unless it is in
// mlp_only_layers, when (i+1) is a multiple of decoder_sparse_step; other
// layers keep the dense MLP of intermediate_size. A backend with
// backend.SoftmaxMoEOps routes and runs the experts on its device for short
// chunks (a decode step: nothing read back, no launch per expert); otherwise,
// and on every backend, the routing runs on the host (layers.SoftmaxRoute)
// and the experts through core ops.
func newQwen3MoE(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	moe := qwen3MoEConfig{NumExperts: 128, NumExpertsPerTok: 8, MoEIntermediateSize: 768, DecoderSparseStep: 1}
	if err := json.Unmarshal(cfg.Raw, &moe); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, cfg.Path, err)
	}
	// transformers 5 saves the expert count as num_local_experts (its
	// attribute map reads num_experts through it); the released configs
	// say num_experts. Either is taken; both must agree.
	var alias struct {
		NumExperts      *int `json:"num_experts"`
		NumLocalExperts *int `json:"num_local_experts"`
	}
	if err := json.Unmarshal(cfg.Raw, &alias); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, cfg.Path, err)
	}
	if n := alias.NumLocalExperts; n != nil {
		if alias.NumExperts != nil && *alias.NumExperts != *n {
			return nil, configErr(cfg.Path, "num_local_experts", "%d contradicts num_experts %d", *n, *alias.NumExperts)
		}
		moe.NumExperts = *n
	}
	if err := moe.check(cfg); err != nil {
		return nil, err
	}
	return loadLlama(b, cfg, l, o, true, &moe)
}

// qwen3MoEConfig holds Qwen3-MoE's own config.json fields, initialized with
// the defaults of transformers' Qwen3MoeConfig.
type qwen3MoEConfig struct {
	NumExperts          int   `json:"num_experts"`
	NumExpertsPerTok    int   `json:"num_experts_per_tok"`
	MoEIntermediateSize int   `json:"moe_intermediate_size"`
	NormTopKProb        bool  `json:"norm_topk_prob"`
	DecoderSparseStep   int   `json:"decoder_sparse_step"`
	MLPOnlyLayers       []int `json:"mlp_only_layers"`
}

// check validates the fields that size and route the experts, naming the
// field at fault.
func (c *qwen3MoEConfig) check(cfg *Config) error {
	path := cfg.Path
	if c.NumExperts < 0 {
		return configErr(path, "num_experts", "must be >= 0, got %d", c.NumExperts)
	}
	if c.DecoderSparseStep <= 0 {
		return configErr(path, "decoder_sparse_step", "must be positive, got %d", c.DecoderSparseStep)
	}
	for _, i := range c.MLPOnlyLayers {
		if i < 0 || i >= cfg.NumLayers {
			return configErr(path, "mlp_only_layers", "layer %d is not in [0, %d)", i, cfg.NumLayers)
		}
	}
	for i := range cfg.NumLayers {
		if !c.sparse(i) {
			continue
		}
		if c.MoEIntermediateSize <= 0 {
			return configErr(path, "moe_intermediate_size", "must be positive, got %d", c.MoEIntermediateSize)
		}
		if c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumExperts {
			return configErr(path, "num_experts_per_tok", "%d must be in [1, num_experts = %d]", c.NumExpertsPerTok, c.NumExperts)
		}
		break
	}
	return nil
}

// sparse reports whether layer i has the mixture of experts, as
// transformers' Qwen3MoeDecoderLayer decides.
func (c *qwen3MoEConfig) sparse(i int) bool {
	return !slices.Contains(c.MLPOnlyLayers, i) && c.NumExperts > 0 && (i+1)%c.DecoderSparseStep == 0
}

// qwen3MoE is one sparse layer's router and experts.
type qwen3MoE struct {
	Router    backend.Weight // mlp.gate, [experts, hidden]
	Experts   []v32MLP
	K         int
	Normalize bool
	ops       backend.SoftmaxMoEOps // the device path's ops, nil without dev
	dev       backend.Experts       // the experts bound for the device path, or nil
}

// load reads a sparse layer's router and experts under prefix ("...mlp.").
func (c *qwen3MoEConfig) load(b backend.Backend, l *Loader, prefix string, hidden int) (*qwen3MoE, error) {
	f := &qwen3MoE{K: c.NumExpertsPerTok, Normalize: c.NormTopKProb}
	var err error
	if f.Router, err = l.Linear(prefix+"gate", c.NumExperts, hidden); err != nil {
		return nil, err
	}
	if f.Experts, err = loadExperts(b, l, prefix, c.NumExperts, c.MoEIntermediateSize, hidden); err != nil {
		return nil, err
	}
	if ops := l.caps.SoftmaxMoE; ops != nil {
		w1, w3, w2 := make([]backend.Weight, len(f.Experts)), make([]backend.Weight, len(f.Experts)), make([]backend.Weight, len(f.Experts))
		for e, x := range f.Experts {
			w1[e], w3[e], w2[e] = x.Gate, x.Up, x.Down
		}
		if f.dev, err = ops.BindExperts(w1, w3, w2, nil); err != nil {
			return nil, fmt.Errorf("model: %sexperts: %w", prefix, err)
		}
		if f.dev != nil {
			f.ops = ops
		}
	}
	return f, nil
}

// moeMLP adds the mixture of experts of the n rows of h (normalized) to x.
// The experts' outputs are added to the residual stream directly. Short
// chunks route on the device where the backend can (the router logits stay
// there), longer ones on the host, which reads each picked expert's
// weights once a chunk rather than once a token.
func (m *Llama) moeMLP(s *moeScratch, f *qwen3MoE, x, h backend.Buffer, n int) {
	b, H, E := m.b, m.cfg.HiddenSize, len(f.Experts)
	a := layers.SoftmaxRouteArgs{M: n, Experts: E, K: f.K, Normalize: f.Normalize}
	if f.dev != nil && n <= f.ops.MaxDeviceMoETokens() {
		rl := b.View(s.rl, 0, n*E)
		b.MatMul(rl, h, f.Router, n)
		f.ops.SoftmaxMoE(x, h, rl, f.dev, a)
		return
	}
	logits, idx, w := s.routerLogits(b, f.Router, h, n, E, f.K)
	layers.SoftmaxRoute(idx, w, logits, a, &s.topk)
	s.runExperts(b, f.Experts, x, h, idx, w, n, f.K, H)
}
