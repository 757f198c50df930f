package model

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
	"github.com/manifoldlm/manifold/weights"
)

// DeepseekV32 is DeepSeek-V3.2 (model_type deepseek_v32): multi-head latent
// attention (MLA) whose keys are chosen per query by DeepSeek Sparse
// Attention's lightning indexer, the first layers with a dense SwiGLU MLP
// and the rest with a DeepSeek-V3 mixture of experts (sigmoid routing with a
// correction bias, group-limited top-k, shared experts). docs/deepseek_v32.md
// states the forward pass this implements.
//
// Two MLA paths compute the same attention: the naive one expands each
// cached latent into per-head keys and values with kv_b_proj, the absorbed
// one folds kv_b_proj into the query and the output and attends in the
// latent space, so its cache holds only the latent, the rope key and the
// indexer key of each token. NewState uses the absorbed cache, decoding with
// the absorbed path and prefilling with whichever costs fewer operations;
// NewStateWith picks a path explicitly.
type DeepseekV32 struct {
	b       backend.Backend
	indexer bool                   // false: DeepSeek-V3, MLA over every token (latent or MLADense)
	ops     backend.SparseMLAOps   // may be nil without the indexer (then MLADense only)
	gmoe    backend.GroupMoEOps    // nil: routed experts on the host
	pipe    backend.TokenPipeliner // nil: the backend cannot run a token it holds (ForwardSampled)
	cfg     *Config
	v       v32Config
	mla     layers.MLAShape
	ixs     dsa.IndexerShape
	scale   float32      // MLA softmax scale (yarn mscale included)
	rope    *layers.RoPE // MLA: interleaved pairs
	irope   *layers.RoPE // indexer: half split, same frequencies
	head
	Blocks []v32Block
	mtp    *v32MTP // the MTP block (mtp_v3.go), nil unless loaded

	maxChunk int // rows a forward pass runs (0: chunkRows's bound; tests set it)
}

// v32Config holds DeepSeek-V3.2's own config.json fields, initialized with
// the defaults of transformers' DeepseekV32Config.
type v32Config struct {
	QLoraRank           *int     `json:"q_lora_rank"`
	KVLoraRank          int      `json:"kv_lora_rank"`
	QKNopeHeadDim       int      `json:"qk_nope_head_dim"`
	QKRopeHeadDim       int      `json:"qk_rope_head_dim"`
	VHeadDim            int      `json:"v_head_dim"`
	IndexNHeads         int      `json:"index_n_heads"`
	IndexHeadDim        int      `json:"index_head_dim"`
	IndexTopK           int      `json:"index_topk"`
	NRoutedExperts      int      `json:"n_routed_experts"`
	NSharedExperts      int      `json:"n_shared_experts"`
	NumExpertsPerTok    int      `json:"num_experts_per_tok"`
	MoEIntermediateSize int      `json:"moe_intermediate_size"`
	NGroup              int      `json:"n_group"`
	TopKGroup           int      `json:"topk_group"`
	NormTopKProb        bool     `json:"norm_topk_prob"`
	RoutedScalingFactor float64  `json:"routed_scaling_factor"`
	FirstKDenseReplace  int      `json:"first_k_dense_replace"`
	MLPLayerTypes       []string `json:"mlp_layer_types"`
	RopeInterleave      bool     `json:"rope_interleave"`
	// Fields of DeepSeek's own configs that transformers does not read:
	// refused unless they mean what transformers computes.
	MoELayerFreq int    `json:"moe_layer_freq"`
	TopKMethod   string `json:"topk_method"`
	ScoringFunc  string `json:"scoring_func"`
}

func defaultV32Config() v32Config {
	q := 1536
	return v32Config{QLoraRank: &q, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		IndexNHeads: 64, IndexHeadDim: 128, IndexTopK: 2048, NRoutedExperts: 256, NSharedExperts: 1,
		NumExpertsPerTok: 8, MoEIntermediateSize: 2048, NGroup: 8, TopKGroup: 4, NormTopKProb: true,
		RoutedScalingFactor: 2.5, FirstKDenseReplace: 3, RopeInterleave: true, MoELayerFreq: 1}
}

// v32Block is one decoder layer. The tagged fields are bound by name; the
// rest are assembled by hand (kv_a_proj_with_mqa is split in two, the MLP is
// dense or MoE).
type v32Block struct {
	AttnNorm backend.Buffer `w:"input_layernorm.weight" shape:"hidden"`
	QA       backend.Weight `w:"self_attn.q_a_proj" shape:"q_lora,hidden"`
	QANorm   backend.Buffer `w:"self_attn.q_a_layernorm.weight" shape:"q_lora"`
	QB       backend.Weight `w:"self_attn.q_b_proj" shape:"q_heads,q_lora"`
	KVANorm  backend.Buffer `w:"self_attn.kv_a_layernorm.weight" shape:"kv_lora"`
	KVB      backend.Weight `w:"self_attn.kv_b_proj" shape:"kv_heads,kv_lora"`
	O        backend.Weight `w:"self_attn.o_proj" shape:"hidden,v_heads"`
	// The lightning indexer: required by deepseek_v32 (checkIndexer);
	// deepseek_v3 has none and never runs one.
	IQB     backend.Weight `w:"self_attn.indexer.wq_b,optional" shape:"index_q,q_lora"`
	IK      backend.Weight `w:"self_attn.indexer.wk,optional" shape:"index_dim,hidden"`
	IKNormW backend.Buffer `w:"self_attn.indexer.k_norm.weight,optional" shape:"index_dim"`
	IKNormB backend.Buffer `w:"self_attn.indexer.k_norm.bias,optional" shape:"index_dim"`
	IW      backend.Weight `w:"self_attn.indexer.weights_proj,optional" shape:"index_heads,hidden"`
	MLPNorm backend.Buffer `w:"post_attention_layernorm.weight" shape:"hidden"`

	KVALatent backend.Weight // kv_a_proj_with_mqa rows [0, kv_lora_rank)
	KVARope   backend.Weight // kv_a_proj_with_mqa rows [kv_lora_rank, +qk_rope_head_dim)

	Dense *v32MLP // mlp_layer_types "dense"
	MoE   *v32MoE // mlp_layer_types "sparse"
}

// v32MoE is the mixture of experts of a sparse layer.
type v32MoE struct {
	Router  backend.Weight // mlp.gate, [experts, hidden]
	Bias    []float32      // e_score_correction_bias: the host route reads it, BindExperts uploads it
	Experts []v32MLP
	Shared  *v32MLP // nil when n_shared_experts is 0
	route   layers.GroupRouteArgs
	dev     backend.Experts // the routed experts bound for the device MoE, or nil
}

// The MLA norms on the latents and the indexer's key LayerNorm use the
// modules' default eps, not rms_norm_eps.
const v32LatentEps, v32IndexerEps = 1e-6, 1e-6

func newDeepseekV32(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	if o.Attention.Kind == "htree" {
		return nil, fmt.Errorf("model: %s does not support htree attention (llama and qwen3 do)", cfg.ModelType)
	}
	return loadDeepseekV32(b, cfg, l, true, o.MTP)
}

// loadDeepseekV32 builds DeepSeek-V3.2 with its indexer, or without it
// (indexer false) DeepSeek-V3, whose MLA attends to every earlier token.
func loadDeepseekV32(b backend.Backend, cfg *Config, l *Loader, indexer, mtp bool) (*DeepseekV32, error) {
	ops := l.caps.SparseMLA
	if ops == nil && indexer {
		return nil, fmt.Errorf("model: deepseek_v32 needs sparse MLA ops (backend.SparseMLAOps); backend %s lacks them", b.Name())
	}
	v := defaultV32Config()
	if err := json.Unmarshal(cfg.Raw, &v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrConfig, cfg.Path, err)
	}
	if err := checkV32Config(cfg, &v, indexer); err != nil {
		return nil, err
	}
	m := &DeepseekV32{b: b, ops: ops, gmoe: l.caps.GroupMoE, pipe: l.caps.Pipeliner, cfg: cfg, v: v, indexer: indexer, Blocks: make([]v32Block, cfg.NumLayers)}
	m.mla = layers.MLAShape{Heads: cfg.NumHeads, QLoraRank: *v.QLoraRank, KVLoraRank: v.KVLoraRank,
		NopeDim: v.QKNopeHeadDim, RopeDim: v.QKRopeHeadDim, VDim: v.VHeadDim}
	if err := m.mla.Validate(); err != nil {
		return nil, configErr(cfg.Path, "attention dims", "%v", err)
	}
	if indexer {
		m.ixs = dsa.IndexerShape{Heads: v.IndexNHeads, HeadDim: v.IndexHeadDim, RopeDim: v.QKRopeHeadDim, TopK: v.IndexTopK}
		if err := m.ixs.Validate(); err != nil {
			return nil, configErr(cfg.Path, "index_*", "%v", err)
		}
	}
	var err error
	if m.scale, err = layers.MLASoftmaxScale(m.mla.QKDim(), cfg.RoPE); err != nil {
		return nil, configErr(cfg.Path, "rope_parameters", "%v", err)
	}
	// transformers points head_dim at qk_rope_head_dim: RoPE covers the rope
	// channels only. MLA rotates interleaved pairs (rope_interleave, true in
	// every released config; false rotates half-split halves), the indexer
	// half-split halves, with the same frequencies and cos/sin scaling.
	if m.irope, err = cfg.NewRoPE(cfg.RoPE, v.QKRopeHeadDim); err != nil {
		return nil, err
	}
	if m.irope.Dim() != v.QKRopeHeadDim {
		return nil, configErr(cfg.Path, "partial_rotary_factor", "RoPE covers %d channels, deepseek_v32 rotates all %d rope channels", m.irope.Dim(), v.QKRopeHeadDim)
	}
	r := *m.irope
	r.Interleaved = v.RopeInterleave
	m.rope = &r

	mla := m.mla
	dims := map[string]int{
		"hidden":      cfg.HiddenSize,
		"q_lora":      mla.QLoraRank,
		"kv_lora":     mla.KVLoraRank,
		"q_heads":     mla.Heads * mla.QKDim(),
		"kv_heads":    mla.Heads * (mla.NopeDim + mla.VDim),
		"v_heads":     mla.Heads * mla.VDim,
		"index_q":     v.IndexNHeads * v.IndexHeadDim,
		"index_dim":   v.IndexHeadDim,
		"index_heads": v.IndexNHeads,
	}
	if m.head, err = loadHead(l, cfg); err != nil {
		return nil, err
	}
	for i := range m.Blocks {
		if err := m.loadBlock(l, fmt.Sprintf("model.layers.%d.", i), &m.Blocks[i], m.sparseMLP(i), dims); err != nil {
			return nil, err
		}
	}
	if mtp {
		if m.mtp, err = m.loadMTP(l, dims); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// loadBlock binds the decoder layer under prefix p into blk, with the MoE
// MLP when sparse.
func (m *DeepseekV32) loadBlock(l *Loader, p string, blk *v32Block, sparse bool, dims map[string]int) error {
	cfg, mla := m.cfg, m.mla
	if err := l.Bind(p, blk, dims); err != nil {
		return err
	}
	if m.indexer {
		if err := blk.checkIndexer(l.Checkpoint(), p); err != nil {
			return err
		}
	}
	kva, err := l.LinearSplit(p+"self_attn.kv_a_proj_with_mqa", cfg.HiddenSize, mla.KVLoraRank, mla.RopeDim)
	if err != nil {
		return err
	}
	blk.KVALatent, blk.KVARope = kva[0], kva[1]
	if sparse {
		blk.MoE, err = m.loadMoE(l, p+"mlp.")
	} else {
		blk.Dense, err = loadMLP(m.b, l, p+"mlp.", cfg.IntermediateSize, cfg.HiddenSize)
	}
	return err
}

// checkIndexer reports the first indexer tensor that layer prefix p lacks,
// naming it.
func (blk *v32Block) checkIndexer(ck *weights.Checkpoint, p string) error {
	for _, w := range []struct {
		name    string
		present bool
	}{
		{"wq_b.weight", blk.IQB != nil}, {"wk.weight", blk.IK != nil}, {"k_norm.weight", blk.IKNormW != nil},
		{"k_norm.bias", blk.IKNormB != nil}, {"weights_proj.weight", blk.IW != nil},
	} {
		if !w.present {
			return &weights.Error{File: ck.Dir(), Tensor: p + "self_attn.indexer." + w.name,
				Err: fmt.Errorf("%w (deepseek_v32's lightning indexer)", weights.ErrMissingTensor)}
		}
	}
	return nil
}

// checkV32Config validates the fields the forward pass relies on, naming
// the field at fault; indexer tells DeepSeek-V3.2 from V3.
func checkV32Config(cfg *Config, v *v32Config, indexer bool) error {
	path := cfg.Path
	if v.QLoraRank == nil {
		return configErr(path, "q_lora_rank", "null is not supported: the attention reads the q low-rank path (DeepSeek-V3.2's indexer too)")
	}
	if cfg.HiddenAct != "" && cfg.HiddenAct != "silu" {
		return configErr(path, "hidden_act", "%q is not supported (silu only)", cfg.HiddenAct)
	}
	// DeepSeek's reference puts the MoE on layers i >= first_k_dense_replace
	// with i % moe_layer_freq == 0, transformers on all of them: they agree
	// at moe_layer_freq 1, as every released config has it.
	if v.MoELayerFreq != 1 {
		return configErr(path, "moe_layer_freq", "%d is not supported (1 only: every layer from first_k_dense_replace on is MoE)", v.MoELayerFreq)
	}
	if v.TopKMethod != "" && v.TopKMethod != "noaux_tc" {
		return configErr(path, "topk_method", "%q is not supported (noaux_tc only: group-limited top-k with the correction bias)", v.TopKMethod)
	}
	if v.ScoringFunc != "" && v.ScoringFunc != "sigmoid" {
		return configErr(path, "scoring_func", "%q is not supported (sigmoid only)", v.ScoringFunc)
	}
	if !finiteFloat32(v.RoutedScalingFactor) {
		return configErr(path, "routed_scaling_factor", "must be a finite number, got %g", v.RoutedScalingFactor)
	}
	if cfg.NumKVHeads != cfg.NumHeads {
		return configErr(path, "num_key_value_heads", "%d; MLA expands one latent into num_attention_heads = %d key heads, so they must be equal", cfg.NumKVHeads, cfg.NumHeads)
	}
	kind := "deepseek_sparse_attention"
	if !indexer {
		kind = "full_attention"
	}
	for i, t := range cfg.LayerTypes {
		if t != kind {
			return configErr(path, "layer_types", "entry %d is %q; %s layers are all %q", i, t, cfg.ModelType, kind)
		}
	}
	if v.MLPLayerTypes != nil {
		if len(v.MLPLayerTypes) != cfg.NumLayers {
			return configErr(path, "mlp_layer_types", "has %d entries for %d layers", len(v.MLPLayerTypes), cfg.NumLayers)
		}
		for i, t := range v.MLPLayerTypes {
			if t != "dense" && t != "sparse" {
				return configErr(path, "mlp_layer_types", "entry %d is %q, want \"dense\" or \"sparse\"", i, t)
			}
		}
	}
	dense, sparse := false, false
	for i := range cfg.NumLayers {
		if sparseLayer(v, cfg.NumLayers, i) {
			sparse = true
		} else {
			dense = true
		}
	}
	if dense && cfg.IntermediateSize <= 0 {
		return configErr(path, "intermediate_size", "must be positive, got %d", cfg.IntermediateSize)
	}
	if sparse {
		if v.MoEIntermediateSize <= 0 {
			return configErr(path, "moe_intermediate_size", "must be positive, got %d", v.MoEIntermediateSize)
		}
		if v.NSharedExperts < 0 {
			return configErr(path, "n_shared_experts", "must be >= 0, got %d", v.NSharedExperts)
		}
		a := layers.GroupRouteArgs{Experts: v.NRoutedExperts, K: v.NumExpertsPerTok, Groups: v.NGroup, TopKGroups: v.TopKGroup}
		if err := a.Validate(); err != nil {
			return configErr(path, "n_routed_experts/num_experts_per_tok/n_group/topk_group", "%v", err)
		}
	}
	return nil
}

// sparseLayer reports whether layer i has the MoE MLP: mlp_layer_types when
// given, else every layer from first_k_dense_replace on.
func sparseLayer(v *v32Config, layers, i int) bool {
	if v.MLPLayerTypes != nil {
		return v.MLPLayerTypes[i] == "sparse"
	}
	return i >= min(v.FirstKDenseReplace, layers)
}

func (m *DeepseekV32) sparseMLP(i int) bool { return sparseLayer(&m.v, m.cfg.NumLayers, i) }

// loadMoE reads a sparse layer's router, experts (loadExperts) and shared
// experts.
func (m *DeepseekV32) loadMoE(l *Loader, prefix string) (*v32MoE, error) {
	v, H := &m.v, m.cfg.HiddenSize
	E, I := v.NRoutedExperts, v.MoEIntermediateSize
	moe := &v32MoE{}
	moe.route = layers.GroupRouteArgs{Experts: E, K: v.NumExpertsPerTok, Groups: v.NGroup, TopKGroups: v.TopKGroup,
		Normalize: v.NormTopKProb, Scale: float32(v.RoutedScalingFactor)}
	var err error
	if moe.Router, err = l.Linear(prefix+"gate", E, H); err != nil {
		return nil, err
	}
	if moe.Bias, err = l.Float32(prefix+"gate.e_score_correction_bias", E); err != nil {
		return nil, err
	}
	if moe.Experts, err = loadExperts(m.b, l, prefix, E, I, H); err != nil {
		return nil, err
	}
	if v.NSharedExperts > 0 {
		if moe.Shared, err = loadMLP(m.b, l, prefix+"shared_experts.", I*v.NSharedExperts, H); err != nil {
			return nil, err
		}
	}
	if ops := l.caps.GroupMoE; ops != nil {
		w1, w3, w2 := make([]backend.Weight, E), make([]backend.Weight, E), make([]backend.Weight, E)
		for e, x := range moe.Experts {
			w1[e], w3[e], w2[e] = x.Gate, x.Up, x.Down
		}
		if moe.dev, err = ops.BindExperts(w1, w3, w2, moe.Bias); err != nil {
			return nil, fmt.Errorf("model: %srouted experts: %w", prefix, err)
		}
	}
	return moe, nil
}

// uploadRows uploads rows [r0, r0+rows) of the tensor name (the fused
// expert weights), viewed as a matrix of its last dimension's columns, in
// its stored format (F32, BF16 or F16); shape is the full shape the config
// implies. Linear modules split by rows go through Loader.LinearSplit.
func uploadRows(b backend.Backend, l *Loader, name string, shape []int, r0, rows int) (backend.Weight, error) {
	t, err := l.Checkpoint().Tensor(name)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(t.Shape, shape) {
		return nil, shapeErr(t, shape)
	}
	cols := shape[len(shape)-1]
	f, err := denseFormat(t, "F32, BF16 or F16")
	if err != nil {
		return nil, err
	}
	size := t.DType.Size()
	return b.Upload(&backend.HostWeight{Name: fmt.Sprintf("%s[rows %d:%d]", name, r0, r0+rows), Rows: rows, Cols: cols, Format: f,
		Data: t.Data[r0*cols*size : (r0+rows)*cols*size]})
}

// Config is the model's config.
func (m *DeepseekV32) Config() *Config { return m.cfg }

// MLAShape is the attention geometry read from the config.
func (m *DeepseekV32) MLAShape() layers.MLAShape { return m.mla }

// IndexerShape is the indexer geometry read from the config.
func (m *DeepseekV32) IndexerShape() dsa.IndexerShape { return m.ixs }
