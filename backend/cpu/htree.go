package cpu

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// This file implements backend.TreeAttentionOps (hierarchical tree attention,
// docs/htree.md): the trees live in host memory as htree.Trees and every
// query head runs htree.Attend, parallel over (token, head) pairs.
// htree_test.go holds it to htree.Reference and to dense attention.

var _ backend.TreeAttentionOps = (*Backend)(nil)

// NewTreeCache allocates the trees and the RoPE table.
func (b *Backend) NewTreeCache(s htree.CacheShape) (backend.TreeCache, error) {
	c, err := htree.NewTrees(s)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	return c, nil
}

// TreeAttention appends k and v to layer's tree and attends. Like
// Attention, it panics on positions past the cache: the model checks them.
func (b *Backend) TreeAttention(out, q, k, v backend.Buffer, cache backend.TreeCache, layer, pos0, m int, s layers.AttentionShape) {
	c := cache.(*htree.Trees)
	par := func(n int, fn func(lo, hi int)) { b.parallel(n, 1, fn) }
	kern := htree.Kernels{RoPEDot: ropeDot, Axpy: func(y []float32, a float32, x []float32) { axpyF32(y, x[:len(y)], a) }}
	if err := c.Attention(out.(Buffer), q.(Buffer), k.(Buffer), v.(Buffer), layer, pos0, m, s, par, kern); err != nil {
		panic(fmt.Sprintf("cpu: %v", err))
	}
}
