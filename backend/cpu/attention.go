package cpu

import (
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// kvCache stores, per layer, keys and values as [position, kvHead, headDim].
type kvCache struct {
	shape backend.KVShape
	k, v  [][]float32
	n     []int // positions stored per layer
}

// NewKVCache allocates the whole cache up front.
func (b *Backend) NewKVCache(s backend.KVShape) (backend.KVCache, error) {
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Capacity <= 0 {
		return nil, fmt.Errorf("cpu: bad KV cache shape %+v", s)
	}
	c := &kvCache{shape: s, k: make([][]float32, s.Layers), v: make([][]float32, s.Layers), n: make([]int, s.Layers)}
	per := s.Capacity * s.KVHeads * s.HeadDim
	for l := range c.k {
		c.k[l] = make([]float32, per)
		c.v[l] = make([]float32, per)
	}
	return c, nil
}

func (c *kvCache) Len() int { return c.n[len(c.n)-1] }
func (c *kvCache) Cap() int { return c.shape.Capacity }
func (c *kvCache) Bytes() int64 {
	return int64(2*c.shape.Layers*c.shape.Capacity*c.shape.KVHeads*c.shape.HeadDim) * 4
}
func (c *kvCache) Truncate(n int) {
	for l := range c.n {
		c.n[l] = min(c.n[l], max(n, 0))
	}
}

// causalOrder is the j-th of m query rows in the order Attention's jobs
// take them: 0, m-1, 1, m-2, ... A causal row's cost grows with its
// position, and parallel hands each thread a contiguous run of jobs: in
// row order the last thread of T had about 2 - 1/T times the mean work
// (1.5x on 2 threads, 1.9x on 16), paired rows even it out.
func causalOrder(j, m int) int {
	if j%2 == 0 {
		return j / 2
	}
	return m - 1 - j/2
}

// Attention appends k, v at pos0.. and attends causally, parallel over
// (token, head) pairs.
func (b *Backend) Attention(out, q, k, v backend.Buffer, cache backend.KVCache, layer, pos0, m int, s layers.AttentionShape) {
	c := cache.(*kvCache)
	row := s.KVHeads * s.HeadDim
	if pos0+m > c.shape.Capacity || pos0 > c.n[layer] {
		panic(fmt.Sprintf("cpu: attention at positions [%d, %d) past the cache (len %d, cap %d)", pos0, pos0+m, c.n[layer], c.shape.Capacity))
	}
	copy(c.k[layer][pos0*row:(pos0+m)*row], k.(Buffer))
	copy(c.v[layer][pos0*row:(pos0+m)*row], v.(Buffer))
	c.n[layer] = pos0 + m
	keys, values := c.k[layer], c.v[layer]
	o, qs := out.(Buffer), q.(Buffer)
	hd := s.HeadDim
	group := s.Heads / s.KVHeads
	if group%4 == 0 { // 4 query heads of a KV head at a time (attn4.go)
		quads := s.Heads / 4
		stride := s.KVHeads * hd
		b.parallel(m*quads, 1, func(lo, hi int) {
			sc := make([]float32, 4*(pos0+m))
			for job := lo; job < hi; job++ {
				i, h := causalOrder(job/quads, m), job%quads*4
				p := pos0 + i
				start := 0
				if s.Window > 0 {
					start = max(0, p-s.Window+1)
				}
				at := (i*s.Heads + h) * hd
				kv := start*stride + h/group*hd
				attend4(o[at:at+4*hd], qs[at:at+4*hd], keys[kv:], values[kv:], stride, p-start+1, hd, s.Scale, sc)
			}
		})
		return
	}
	b.parallel(m*s.Heads, 1, func(lo, hi int) {
		scores := make([]float32, pos0+m)
		acc := make([]float32, hd)
		for job := lo; job < hi; job++ {
			i, h := causalOrder(job/s.Heads, m), job%s.Heads
			at := i*s.Heads + h
			p := pos0 + i
			start := 0
			if s.Window > 0 {
				start = max(0, p-s.Window+1)
			}
			kh := h / group
			qv := qs[at*hd : (at+1)*hd]
			mx := float32(math.Inf(-1))
			for t := start; t <= p; t++ {
				d := dotF32(qv, keys[(t*s.KVHeads+kh)*hd:(t*s.KVHeads+kh+1)*hd]) * s.Scale
				scores[t] = d
				mx = max(mx, d)
			}
			var sum float32
			for t := start; t <= p; t++ {
				e := expf32(scores[t] - mx)
				scores[t] = e
				sum += e
			}
			clear(acc)
			for t := start; t <= p; t++ {
				wt := scores[t]
				axpyF32(acc, values[(t*s.KVHeads+kh)*hd:(t*s.KVHeads+kh+1)*hd], wt)
			}
			inv := 1 / sum
			ov := o[at*hd : (at+1)*hd]
			for j := range ov {
				ov[j] = acc[j] * inv
			}
		}
	})
}
