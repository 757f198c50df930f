package htree

import (
	"fmt"

	"github.com/manifoldlm/manifold/layers"
)

// CacheShape is the geometry of the trees of every htree layer of one
// sequence, with the options and the RoPE their queries use.
type CacheShape struct {
	Layers, KVHeads, HeadDim, Capacity int
	Options                            Options // zero fields: defaults
	RoPE                               *layers.RoPE
}

// Trees is a tree cache in host memory (the CPU backend's): one Tree per layer
// and the RoPE table.
type Trees struct {
	shape  CacheShape
	layers []*Tree
	rotary *Rotary
}

// NewTrees allocates empty trees for s.
func NewTrees(s CacheShape) (*Trees, error) {
	s.Options = s.Options.WithDefaults()
	if err := s.Options.Validate(); err != nil {
		return nil, err
	}
	if s.Layers <= 0 {
		return nil, fmt.Errorf("htree: cache of %d layers", s.Layers)
	}
	c := &Trees{shape: s, layers: make([]*Tree, s.Layers)}
	for l := range c.layers {
		tr, err := NewTree(s.Options, s.KVHeads, s.HeadDim, s.Capacity)
		if err != nil {
			return nil, err
		}
		c.layers[l] = tr
	}
	ro, err := NewRotary(s.RoPE, s.HeadDim, s.Options.MaxCandidates())
	if err != nil {
		return nil, err
	}
	c.rotary = ro
	return c, nil
}

// Shape is the shape the trees were made for, defaults filled in.
func (c *Trees) Shape() CacheShape { return c.shape }

// Layer is layer l's tree.
func (c *Trees) Layer(l int) *Tree { return c.layers[l] }

// Rotary is the RoPE table.
func (c *Trees) Rotary() *Rotary { return c.rotary }

// Len is the number of positions of the last layer (every layer's, once a
// forward pass completes).
func (c *Trees) Len() int { return c.layers[len(c.layers)-1].Len() }

// Cap is the number of positions a tree holds.
func (c *Trees) Cap() int { return c.shape.Capacity }

// Truncate drops every position from n on in every layer.
func (c *Trees) Truncate(n int) {
	for _, tr := range c.layers {
		tr.Truncate(n)
	}
}

// Bytes is the memory of every tree and the RoPE table.
func (c *Trees) Bytes() int64 {
	b := c.rotary.Bytes()
	for _, tr := range c.layers {
		b += tr.Bytes()
	}
	return b
}

// Attention is backend.TreeAttentionOps.TreeAttention on host slices: it appends k and v to layer's
// tree and runs Attend for each of the m·Heads query heads, split over
// parallel (which calls fn on disjoint ranges covering [0, n), possibly
// concurrently; nil runs fn(0, n)), with the inner loops of kern.
func (c *Trees) Attention(out, q, k, v []float32, layer, pos0, m int, s layers.AttentionShape, parallel func(n int, fn func(lo, hi int)), kern Kernels) error {
	if layer < 0 || layer >= len(c.layers) {
		return fmt.Errorf("htree: layer %d of a cache of %d", layer, len(c.layers))
	}
	if s.KVHeads != c.shape.KVHeads || s.HeadDim != c.shape.HeadDim || s.Heads <= 0 || s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("htree: attention shape %+v on a cache of %d KV heads of %d channels", s, c.shape.KVHeads, c.shape.HeadDim)
	}
	hd := s.HeadDim
	if m <= 0 || len(q) < m*s.Heads*hd || len(out) < m*s.Heads*hd {
		return fmt.Errorf("htree: attention of %d queries with %d query and %d output values, want %d", m, len(q), len(out), m*s.Heads*hd)
	}
	row := s.KVHeads * hd
	if len(k) < m*row || len(v) < m*row {
		return fmt.Errorf("htree: attention of %d queries with %d key and %d value values, want %d", m, len(k), len(v), m*row)
	}
	tr := c.layers[layer]
	if err := tr.Append(k[:m*row], v[:m*row], pos0); err != nil {
		return fmt.Errorf("htree: layer %d: %w", layer, err)
	}
	if parallel == nil {
		parallel = func(n int, fn func(lo, hi int)) { fn(0, n) }
	}
	group := s.Heads / s.KVHeads
	parallel(m*s.Heads, func(lo, hi int) {
		sc := NewScratch(c.shape.Options, hd, kern)
		for job := lo; job < hi; job++ {
			i, h := job/s.Heads, job%s.Heads
			Attend(out[job*hd:(job+1)*hd], q[job*hd:(job+1)*hd], tr, c.rotary, pos0+i, h/group, s.Scale, sc)
		}
	})
	return nil
}
