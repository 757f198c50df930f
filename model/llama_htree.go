package model

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// AttentionOptions choose the attention of the architectures that offer a
// choice (Llama and Qwen3): dense causal attention, or htree hierarchical
// sparse attention (docs/htree.md) in every full-attention layer from
// FirstLayer on. Sliding-window layers always stay dense.
type AttentionOptions struct {
	// Kind is "dense" (or "") or "htree".
	Kind string
	// HTree are htree's parameters; zero fields take the defaults (rate 16,
	// top-K 512, exact below TopK*Rate positions). A query at a position
	// below HTree.TopCandidates attends exactly, so TopCandidates is the
	// context length past which htree approximates.
	HTree htree.Options
	// FirstLayer is the first layer that runs htree; earlier layers stay dense.
	FirstLayer int
}

// validate checks the kind; the architecture checks the rest.
func (o AttentionOptions) validate() error {
	switch o.Kind {
	case "", "dense", "htree":
		return nil
	}
	return fmt.Errorf("model: attention %q: want dense or htree", o.Kind)
}

// llamaHTree runs a Llama's attention layers, some on htree and the others
// dense, each kind with its own cache indexed compactly.
type llamaHTree struct {
	ops          backend.TreeAttentionOps
	opts         htree.Options
	index        []int // per layer: its tree index if >= 0, else -(dense index)-1
	trees, dense int
}

func newLlamaHTree(m *Llama, caps backend.Capabilities, o AttentionOptions) (*llamaHTree, error) {
	opts := o.HTree.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if o.FirstLayer < 0 || o.FirstLayer >= len(m.Blocks) {
		return nil, fmt.Errorf("model: htree first layer %d: the model has layers 0..%d", o.FirstLayer, len(m.Blocks)-1)
	}
	ops := caps.TreeAttention
	if ops == nil {
		return nil, fmt.Errorf("model: htree attention needs tree-attention ops (backend.TreeAttentionOps); backend %s lacks them (use the cpu device)", m.b.Name())
	}
	h := &llamaHTree{ops: ops, opts: opts, index: make([]int, len(m.Blocks))}
	for l := range m.Blocks {
		if l >= o.FirstLayer && m.attn[l].Window == 0 {
			h.index[l] = h.trees
			h.trees++
		} else {
			h.index[l] = -h.dense - 1
			h.dense++
		}
	}
	if h.trees == 0 {
		return nil, fmt.Errorf("model: htree from layer %d: every such layer uses a sliding window", o.FirstLayer)
	}
	return h, nil
}

// htreeKV is a Llama state's cache under htree: the trees, and the dense KV
// cache of the dense layers (nil when there are none).
type htreeKV struct {
	trees backend.TreeCache
	dense backend.KVCache
}

func (c *htreeKV) Len() int { return c.trees.Len() }
func (c *htreeKV) Cap() int { return c.trees.Cap() }
func (c *htreeKV) Truncate(n int) {
	c.trees.Truncate(n)
	if c.dense != nil {
		c.dense.Truncate(n)
	}
}
func (c *htreeKV) Bytes() int64 {
	if c.dense == nil {
		return c.trees.Bytes()
	}
	return c.trees.Bytes() + c.dense.Bytes()
}

func (h *llamaHTree) newState(m *Llama, capacity int) (State, error) {
	c := m.cfg
	trees, err := h.ops.NewTreeCache(htree.CacheShape{Layers: h.trees, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim,
		Capacity: capacity, Options: h.opts, RoPE: m.rope})
	if err != nil {
		return nil, err
	}
	kv := &htreeKV{trees: trees}
	if h.dense > 0 {
		if kv.dense, err = m.b.NewKVCache(backend.KVShape{Layers: h.dense, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim, Capacity: capacity}); err != nil {
			return nil, err
		}
	}
	return &llamaState{cache: kv}, nil
}

// attention is layer l's attention for n tokens at pos0 with q and k before
// RoPE: htree rotates by candidate index, a dense layer by position.
func (h *llamaHTree) attention(m *Llama, att, q, k, v backend.Buffer, cache backend.KVCache, l, pos0, n int) {
	c, b, kv := m.cfg, m.b, cache.(*htreeKV)
	if i := h.index[l]; i >= 0 {
		h.ops.TreeAttention(att, q, k, v, kv.trees, i, pos0, n, m.attn[l])
		return
	}
	b.RoPE(q, n, c.NumHeads, c.HeadDim, 0, pos0, m.rope, false)
	b.RoPE(k, n, c.NumKVHeads, c.HeadDim, 0, pos0, m.rope, false)
	b.Attention(att, q, k, v, kv.dense, -h.index[l]-1, pos0, n, m.attn[l])
}
