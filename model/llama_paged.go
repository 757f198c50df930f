package model

import (
	"errors"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/kvpage"
	"github.com/manifoldlm/manifold/layers"
)

// ErrNoPaging is wrapped by the error of NewPagedCache when the backend
// lacks backend.PagedAttentionOps or the model's attention cannot be paged:
// its sessions then keep a KVCache each (NewState).
var ErrNoPaging = errors.New("paged KV cache not supported")

// Pager is implemented by models whose sequences can share one paged KV
// cache (Llama and Qwen3 with full or sliding-window attention).
type Pager interface {
	// NewPagedCache allocates a pool of blocks blocks of blockSize
	// positions for the model's sequences (PagedCache.NewState).
	NewPagedCache(blocks, blockSize int) (*PagedCache, error)
}

// PagedCache is a pool of KV blocks shared by the sequences of a model: a
// state it makes keeps a block table instead of a cache of its own, and
// sequences whose prompts share a prefix of whole blocks share them
// (PagedCache.Share), copy-on-write. Safe for concurrent use; each state is
// not, as any State.
type PagedCache struct {
	m     *Llama
	ops   backend.PagedAttentionOps
	pool  backend.BlockPool
	alloc *kvpage.Allocator
}

// pagedKV is a sequence's view of a PagedCache: the backend.KVCache of a
// llamaState, so that Len, Cap and Truncate mean what they do unpaged.
type pagedKV struct {
	c   *PagedCache
	seq *kvpage.Seq
	cap int
}

func (p *pagedKV) Len() int       { return p.seq.Len() }
func (p *pagedKV) Cap() int       { return p.cap }
func (p *pagedKV) Truncate(n int) { p.seq.Truncate(n) }

// Bytes is the memory of the blocks the sequence holds (shared ones
// counted in full).
func (p *pagedKV) Bytes() int64 { return int64(len(p.seq.Table())) * p.c.BlockBytes() }

// NewPagedCache allocates the pool (see Pager).
func (m *Llama) NewPagedCache(blocks, blockSize int) (*PagedCache, error) {
	ops := m.paged
	switch {
	case ops == nil:
		return nil, fmt.Errorf("model: backend %s lacks PagedAttentionOps: %w", m.b.Name(), ErrNoPaging)
	case m.htree != nil:
		return nil, fmt.Errorf("model: htree attention keeps its own trees: %w", ErrNoPaging)
	}
	alloc, err := kvpage.New(blocks, blockSize)
	if err != nil {
		return nil, fmt.Errorf("model: paged cache: %w", err)
	}
	c := m.cfg
	pool, err := ops.NewBlockPool(backend.PagedShape{Layers: c.NumLayers, KVHeads: c.NumKVHeads, HeadDim: c.HeadDim, BlockSize: blockSize, Blocks: blocks})
	if err != nil {
		return nil, fmt.Errorf("model: paged cache: %w", err)
	}
	return &PagedCache{m: m, ops: ops, pool: pool, alloc: alloc}, nil
}

// NewState returns an empty sequence of up to capacity positions.
func (c *PagedCache) NewState(capacity int) (State, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("model: paged state of %d positions", capacity)
	}
	return &llamaState{cache: &pagedKV{c: c, seq: c.alloc.NewSeq(), cap: capacity}}, nil
}

// Share makes st, an empty state of c, hold the cached blocks of the
// longest prefix of prompt made of whole blocks (at most len(prompt)-1
// positions), and returns the positions it holds: those need not run.
func (c *PagedCache) Share(st State, prompt []int32) int {
	if s, ok := st.(*llamaState); ok {
		if p, ok := s.cache.(*pagedKV); ok && p.c == c {
			return p.seq.Share(prompt)
		}
	}
	return 0
}

// Stats are the allocator's counts.
func (c *PagedCache) Stats() kvpage.Stats { return c.alloc.Stats() }

// BlockSize is the positions of a block.
func (c *PagedCache) BlockSize() int { return c.alloc.BlockSize() }

// FreeBlocks is the blocks a sequence could take now.
func (c *PagedCache) FreeBlocks() int { return c.alloc.Free() }

// Blocks is the blocks n positions take.
func (c *PagedCache) Blocks(n int) int { return c.alloc.Blocks(n) }

// Bytes is the memory of the pool.
func (c *PagedCache) Bytes() int64 { return c.pool.Bytes() }

// BlockBytes is the memory of one block.
func (c *PagedCache) BlockBytes() int64 { return c.pool.Bytes() / int64(c.pool.Shape().Blocks) }

// pagedOf returns s's paged cache, or nil.
func pagedOf(s *llamaState) *pagedKV {
	p, _ := s.cache.(*pagedKV)
	return p
}

// reserve makes room in a paged state for tokens (-1: a token whose id is
// on the device only) and makes the copies on write it needs.
func (p *pagedKV) reserve(tokens []int32) error {
	copies, err := p.seq.Append(tokens)
	if err != nil {
		return fmt.Errorf("model: paged cache: %w", err)
	}
	for _, cp := range copies {
		p.c.ops.CopyBlock(p.c.pool, int(cp[0]), int(cp[1]))
	}
	return nil
}

// attendPaged rotates each sequence's rows of q and k (the rows of
// seqs[0], then seqs[1], ...; RoPE not yet applied) at their positions,
// appends the keys and values to layer l of the pool and attends all the
// rows of q: two calls for every sequence of a step.
func (m *Llama) attendPaged(c *PagedCache, l int, att, q, k, v backend.Buffer, seqs []layers.PagedSeq) {
	c.ops.PagedAppendRoPE(c.pool, l, q, k, v, seqs, m.cfg.NumHeads, m.rope)
	c.ops.PagedAttention(att, q, c.pool, l, seqs, m.attn[l])
}

// ErrNoBlocks is wrapped by the error of a forward pass on a paged state
// when the pool has too few free blocks for its tokens.
var ErrNoBlocks = kvpage.ErrNoBlocks

// PagedCacheOf returns the paged cache st keeps its blocks in, or nil for a
// state with a cache of its own.
func PagedCacheOf(st State) *PagedCache {
	if s, ok := st.(*llamaState); ok {
		if p := pagedOf(s); p != nil {
			return p.c
		}
	}
	return nil
}

// Need is the free blocks a forward pass of n tokens on st (a state of c)
// takes.
func (c *PagedCache) Need(st State, n int) int {
	if s, ok := st.(*llamaState); ok {
		if p := pagedOf(s); p != nil && p.c == c {
			return p.seq.Need(n)
		}
	}
	return 0
}
