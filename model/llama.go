package model

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/weights"
)

// Llama is the Llama decoder (and, with per-head q/k norms, Qwen3's): token
// embedding, N blocks of pre-norm grouped-query attention with RoPE and a
// pre-norm SwiGLU MLP, a final RMSNorm and the LM head.
type Llama struct {
	b     backend.Backend
	cfg   *Config
	rope  *layers.RoPE
	attn  []layers.AttentionShape   // per layer (sliding windows differ)
	htree *llamaHTree               // non-nil: htree attention (Options.Attention, llama_htree.go)
	moe   *qwen3MoEConfig           // non-nil: Qwen3-MoE (qwen3_moe.go)
	pipe  backend.TokenPipeliner    // nil: the backend cannot run a token it holds
	paged backend.PagedAttentionOps // nil: the backend cannot page caches (NewPagedCache fails)
	// batchMu guards batch, the scratch of ForwardBatch (llama_batch.go).
	batchMu sync.Mutex
	batch   llamaBatch
	head
	Blocks []llamaBlock
}

type llamaBlock struct {
	AttnNorm backend.Buffer `w:"input_layernorm.weight" shape:"hidden"`
	Q        backend.Weight `w:"self_attn.q_proj" shape:"q,hidden"`
	K        backend.Weight `w:"self_attn.k_proj" shape:"kv,hidden"`
	V        backend.Weight `w:"self_attn.v_proj" shape:"kv,hidden"`
	O        backend.Weight `w:"self_attn.o_proj" shape:"hidden,q"`
	QNorm    backend.Buffer `w:"self_attn.q_norm.weight,optional" shape:"head_dim"` // Qwen3
	KNorm    backend.Buffer `w:"self_attn.k_norm.weight,optional" shape:"head_dim"` // Qwen3
	MLPNorm  backend.Buffer `w:"post_attention_layernorm.weight" shape:"hidden"`
	// The dense MLP, required unless the layer is a mixture of experts.
	Gate backend.Weight `w:"mlp.gate_proj,optional" shape:"ffn,hidden"`
	Up   backend.Weight `w:"mlp.up_proj,optional" shape:"ffn,hidden"`
	Down backend.Weight `w:"mlp.down_proj,optional" shape:"hidden,ffn"`

	MoE *qwen3MoE // Qwen3-MoE's sparse layers (qwen3_moe.go), nil for a dense MLP
}

func newLlama(b backend.Backend, cfg *Config, l *Loader, o Options) (Model, error) {
	return loadLlama(b, cfg, l, o, false, nil)
}

// loadLlama builds the Llama decoder, with q/k norms when qkNorm is set
// (Qwen3) and Qwen3-MoE's sparse layers when moe is not nil.
func loadLlama(b backend.Backend, cfg *Config, l *Loader, o Options, qkNorm bool, moe *qwen3MoEConfig) (*Llama, error) {
	if cfg.HiddenAct != "" && cfg.HiddenAct != "silu" {
		return nil, configErr(cfg.Path, "hidden_act", "%q is not supported (silu only)", cfg.HiddenAct)
	}
	if cfg.IntermediateSize <= 0 {
		return nil, configErr(cfg.Path, "intermediate_size", "must be positive, got %d", cfg.IntermediateSize)
	}
	rope, err := cfg.NewRoPE(cfg.RoPE, cfg.HeadDim)
	if err != nil {
		return nil, err
	}
	m := &Llama{b: b, cfg: cfg, rope: rope, pipe: l.caps.Pipeliner, paged: l.caps.Paged, moe: moe, Blocks: make([]llamaBlock, cfg.NumLayers)}
	dims := map[string]int{
		"hidden":   cfg.HiddenSize,
		"q":        cfg.NumHeads * cfg.HeadDim,
		"kv":       cfg.NumKVHeads * cfg.HeadDim,
		"head_dim": cfg.HeadDim,
		"ffn":      cfg.IntermediateSize,
	}
	if m.head, err = loadHead(l, cfg); err != nil {
		return nil, err
	}
	for i := range m.Blocks {
		blk := &m.Blocks[i]
		p := fmt.Sprintf("model.layers.%d.", i)
		if err := l.Bind(p, blk, dims); err != nil {
			return nil, err
		}
		if moe != nil && moe.sparse(i) {
			if blk.MoE, err = moe.load(b, l, p+"mlp.", cfg.HiddenSize); err != nil {
				return nil, err
			}
		} else if blk.Gate == nil || blk.Up == nil || blk.Down == nil {
			_, err := loadMLP(b, l, p+"mlp.", cfg.IntermediateSize, cfg.HiddenSize) // the error naming the missing tensor
			return nil, err
		}
		if qkNorm && (blk.QNorm == nil || blk.KNorm == nil) {
			return nil, fmt.Errorf("%w: %s: %s: layer %d lacks self_attn.q_norm/k_norm weights (model.layers.%d.self_attn.q_norm.weight): %w",
				ErrConfig, l.Checkpoint().Dir(), cfg.ModelType, i, i, weights.ErrMissingTensor)
		}
		s := layers.AttentionShape{Heads: cfg.NumHeads, KVHeads: cfg.NumKVHeads, HeadDim: cfg.HeadDim,
			Scale: float32(1 / math.Sqrt(float64(cfg.HeadDim)))}
		if cfg.UseSlidingWindow && cfg.SlidingWindow > 0 && len(cfg.LayerTypes) > i && cfg.LayerTypes[i] == "sliding_attention" {
			s.Window = cfg.SlidingWindow
		}
		m.attn = append(m.attn, s)
	}
	if o.Attention.Kind == "htree" {
		if m.htree, err = newLlamaHTree(m, l.caps, o.Attention); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Config is the model's config.
func (m *Llama) Config() *Config { return m.cfg }

// llamaState is one sequence: the KV cache and activation scratch.
type llamaState struct {
	cache backend.KVCache
	llamaBuffers
	logits backend.Buffer // [rows, vocab]: Forward may return every row's
}

// llamaBuffers is activation scratch for up to rows rows.
type llamaBuffers struct {
	rows                         int
	x, h, q, k, v, att, gate, up backend.Buffer
	moeScratch                   // Qwen3-MoE's host routing
}

func (s *llamaState) Len() int          { return s.cache.Len() }
func (s *llamaState) Cap() int          { return s.cache.Cap() }
func (s *llamaState) Truncate(n int)    { s.cache.Truncate(n) }
func (s *llamaState) CacheBytes() int64 { return s.cache.Bytes() }
func (s *llamaState) CacheBytesPerToken() int64 {
	return s.cache.Bytes() / int64(s.cache.Cap())
}

// NewState allocates a KV cache for capacity positions.
func (m *Llama) NewState(capacity int) (State, error) {
	if m.htree != nil {
		return m.htree.newState(m, capacity)
	}
	c := m.cfg
	cache, err := m.b.NewKVCache(backend.KVShape{Layers: c.NumLayers, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim, Capacity: capacity})
	if err != nil {
		return nil, err
	}
	return &llamaState{cache: cache}, nil
}

// grow makes the scratch buffers hold n rows.
func (m *Llama) grow(s *llamaBuffers, n int) bool {
	if s.rows >= n {
		return false
	}
	c, b := m.cfg, m.b
	s.rows = n
	s.x = b.NewBuffer(n * c.HiddenSize)
	s.h = b.NewBuffer(n * c.HiddenSize)
	s.q = b.NewBuffer(n * c.NumHeads * c.HeadDim)
	s.att = b.NewBuffer(n * c.NumHeads * c.HeadDim)
	s.k = b.NewBuffer(n * c.NumKVHeads * c.HeadDim)
	s.v = b.NewBuffer(n * c.NumKVHeads * c.HeadDim)
	s.gate = b.NewBuffer(n * c.IntermediateSize)
	s.up = b.NewBuffer(n * c.IntermediateSize)
	if m.moe != nil {
		s.growMoE(b, n, m.moe.NumExperts, m.moe.MoEIntermediateSize, c.HiddenSize)
	}
	return true
}

// views are the first n rows of s's buffers.
func (m *Llama) views(s *llamaBuffers, n int) llamaScratch {
	c, b := m.cfg, m.b
	view := func(buf backend.Buffer, width int) backend.Buffer { return b.View(buf, 0, n*width) }
	qw, kw := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	return llamaScratch{x: view(s.x, c.HiddenSize), h: view(s.h, c.HiddenSize), q: view(s.q, qw), att: view(s.att, qw),
		k: view(s.k, kw), v: view(s.v, kw), gate: view(s.gate, c.IntermediateSize), up: view(s.up, c.IntermediateSize),
		moe: &s.moeScratch}
}

// forward runs the decoder over tokens and returns the logits on the backend:
// every token's when all is set, else the last one's.
// embed, when not nil, fills x in place of the gather of tokens' rows.
func (m *Llama) forward(ctx context.Context, st State, tokens []int32, embed func(x backend.Buffer), all bool) (backend.Buffer, error) {
	s, ok := st.(*llamaState)
	if !ok {
		return nil, fmt.Errorf("model: state of type %T is not a %s state", st, m.cfg.ModelType)
	}
	if err := checkForward(m.cfg, st, tokens); err != nil {
		return nil, err
	}
	c, b := m.cfg, m.b
	n, pos0 := len(tokens), s.cache.Len()
	p := pagedOf(s)
	if p != nil {
		ids := tokens
		if embed != nil {
			ids = []int32{-1} // its id is on the device: its block is never shared
		}
		if err := p.reserve(ids); err != nil {
			return nil, err
		}
	}
	if m.grow(&s.llamaBuffers, n) {
		s.logits = b.NewBuffer(n * c.VocabSize)
	}
	sc := m.views(&s.llamaBuffers, n)
	if embed != nil {
		embed(sc.x)
	} else {
		b.Embed(sc.x, m.Embed, tokens)
	}
	err := m.blocks(ctx, sc, n, func(l int, att, q, k, v backend.Buffer) {
		m.attend(s, l, att, q, k, v, pos0, n)
	})
	if err != nil {
		s.cache.Truncate(pos0)
		return nil, err
	}
	if p != nil {
		p.seq.Commit()
	}
	return m.head.logits(b, c, sc.x, sc.h, s.logits, n, all), nil
}

// llamaScratch is the activations of one pass over n rows: x and h
// [n, hidden], q and att [n, heads*head_dim], k and v [n, kv_heads*head_dim],
// gate and up [n, ffn].
type llamaScratch struct {
	x, h, q, k, v, att, gate, up backend.Buffer
	moe                          *moeScratch // Qwen3-MoE's host routing
}

// blocks runs the decoder blocks over the n rows of sc.x (embedded), leaving
// the last block's output in sc.x. attend runs layer l's attention of the
// rows' q, k and v (q and k normed, not rotated) into att: the rows may
// belong to one sequence or to several (ForwardBatch), every other op
// covers all n rows at once. ctx is checked before each layer.
func (m *Llama) blocks(ctx context.Context, sc llamaScratch, n int, attend func(l int, att, q, k, v backend.Buffer)) error {
	c, b := m.cfg, m.b
	x, h, q, k, v, att, gate, up := sc.x, sc.h, sc.q, sc.k, sc.v, sc.att, sc.gate, sc.up
	for l := range m.Blocks {
		if err := ctx.Err(); err != nil {
			return err
		}
		blk := &m.Blocks[l]
		// Attention: x += O · attn(RoPE(Q·norm(x)), RoPE(K·norm(x)), V·norm(x)).
		b.RMSNorm(h, x, blk.AttnNorm, c.RMSNormEps)
		b.MatMul(q, h, blk.Q, n)
		b.MatMul(k, h, blk.K, n)
		b.MatMul(v, h, blk.V, n)
		if blk.QNorm != nil {
			b.RMSNorm(q, q, blk.QNorm, c.RMSNormEps)
			b.RMSNorm(k, k, blk.KNorm, c.RMSNormEps)
		}
		attend(l, att, q, k, v)
		b.MatMul(h, att, blk.O, n)
		b.Add(x, x, h)
		b.RMSNorm(h, x, blk.MLPNorm, c.RMSNormEps)
		if blk.MoE != nil {
			// MoE: x += sum over norm(x)'s top-k experts e of p_e · Expert_e(norm(x)).
			m.moeMLP(sc.moe, blk.MoE, x, h, n)
			continue
		}
		// MLP: x += Down · (silu(Gate·norm(x)) * Up·norm(x)).
		b.MatMul(gate, h, blk.Gate, n)
		b.MatMul(up, h, blk.Up, n)
		b.SwiGLU(gate, gate, up, 0)
		b.MatMul(h, gate, blk.Down, n)
		b.Add(x, x, h)
	}
	return nil
}

// attend runs layer l's attention of n rows of one sequence, at positions
// pos0.., appending their keys and values to its cache.
func (m *Llama) attend(s *llamaState, l int, att, q, k, v backend.Buffer, pos0, n int) {
	c, b := m.cfg, m.b
	if m.htree != nil { // q and k before RoPE: htree rotates by candidate index
		m.htree.attention(m, att, q, k, v, s.cache, l, pos0, n)
		return
	}
	if p := pagedOf(s); p != nil { // RoPE in the append
		m.attendPaged(p.c, l, att, q, k, v, []layers.PagedSeq{{Table: p.seq.Table(), Pos0: pos0, Rows: n}})
		return
	}
	b.RoPE(q, n, c.NumHeads, c.HeadDim, 0, pos0, m.rope, false)
	b.RoPE(k, n, c.NumKVHeads, c.HeadDim, 0, pos0, m.rope, false)
	b.Attention(att, q, k, v, s.cache, l, pos0, n, m.attn[l])
}

// Forward runs the decoder over tokens and reads the logits back.
func (m *Llama) Forward(ctx context.Context, st State, tokens []int32, all bool) ([]float32, error) {
	logits, err := m.forward(ctx, st, tokens, nil, all)
	return hostLogits(m.b, logits, err)
}

// ForwardDevice runs the decoder over tokens and leaves the last token's
// logits on the backend (valid until the next call with st).
func (m *Llama) ForwardDevice(ctx context.Context, st State, tokens []int32) (backend.Buffer, error) {
	return m.forward(ctx, st, tokens, nil, false)
}

// ForwardSampled runs the token whose id src holds on the backend (see
// SampledForwarder) and leaves its logits there.
func (m *Llama) ForwardSampled(ctx context.Context, st State, src backend.Buffer) (backend.Buffer, error) {
	tp := m.pipe
	if tp == nil {
		return nil, fmt.Errorf("model: backend %s cannot run a token it holds", m.b.Name())
	}
	// Token 0 stands for the held one in the checks; EmbedToken reads src.
	return m.forward(ctx, st, []int32{0}, func(x backend.Buffer) { tp.EmbedToken(x, m.Embed, src) }, false)
}
