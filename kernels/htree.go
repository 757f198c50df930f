package kernels

import (
	"fmt"
	"runtime"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// htree attention on the GPU (backend.TreeAttentionOps, docs/htree.md), kernels in
// htree.cuh: the trees live in device memory, one allocation per layer for
// the keys of every level and one for the values; the RoPE table is made on
// the host exactly as htree.NewRotary makes it. ops_test.go holds the op to
// the CPU backend.

var _ backend.TreeAttentionOps = (*Backend)(nil)

// htMaxLevels is HT_MAXLEVELS of htree.cuh.
const htMaxLevels = 32

// htWave bounds the query heads of one wave of launches (each head takes
// its own slice of the scratch memory).
const htWave = 512

// htTile is HT_T of htree.cuh: candidates per block of ht_score and ht_part.
const htTile = 64

// htCombineShare is ht_combine's dynamic shared memory in bytes for np
// partials: their factors and 16 warps' column sums.
func htCombineShare(np, hd int) int { return 4 * (np + 16*hd) }

// htreeCache is the GPU's backend.TreeCache.
type htreeCache struct {
	shape    htree.CacheShape // options with defaults
	row      int              // KVHeads*HeadDim
	off      []int32          // first node of each level, htMaxLevels entries
	nodes    int              // nodes of all levels
	k, v     []*allocation    // per layer
	n        []int            // positions per layer
	cos, sin *allocation      // [mc, half]
	half, mc int
	scratch  *allocation // per query head: scores, candidates, flags [mc each], parents [TopK]
	scrCap   int         // 4-byte words
	part     *allocation // ht_part's partials [heads of a wave, levels, tiles, hd+2]
	partCap  int
}

func (c *htreeCache) Len() int { return c.n[len(c.n)-1] }
func (c *htreeCache) Cap() int { return c.shape.Capacity }
func (c *htreeCache) Truncate(n int) {
	for l := range c.n {
		c.n[l] = min(c.n[l], max(n, 0))
	}
}
func (c *htreeCache) Bytes() int64 {
	return 4 * (2*int64(len(c.k))*int64(c.nodes)*int64(c.row) + 2*int64(c.mc)*int64(c.half))
}

// NewTreeCache allocates the trees and uploads the RoPE table.
func (b *Backend) NewTreeCache(s htree.CacheShape) (backend.TreeCache, error) {
	s.Options = s.Options.WithDefaults()
	o := s.Options
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("kernels: %w", err)
	}
	if s.Layers <= 0 || s.KVHeads <= 0 || s.HeadDim <= 0 || s.Capacity <= 0 {
		return nil, fmt.Errorf("kernels: htree cache of %d layers, %d KV heads, head dim %d, capacity %d: all must be positive",
			s.Layers, s.KVHeads, s.HeadDim, s.Capacity)
	}
	r := s.RoPE
	if r == nil || r.Dim() == 0 || r.Dim() > s.HeadDim {
		return nil, fmt.Errorf("kernels: htree needs a RoPE of at most head dim %d rotated channels", s.HeadDim)
	}
	levels := o.Levels(s.Capacity)
	if levels > htMaxLevels {
		return nil, fmt.Errorf("kernels: htree of %d levels (rate %d, capacity %d): the kernels take at most %d", levels, o.Rate, s.Capacity, htMaxLevels)
	}
	if need := htCombineShare(levels*((o.MaxCandidates()+htTile-1)/htTile), s.HeadDim); need > b.opsShare() {
		return nil, fmt.Errorf("kernels: htree of head dim %d and %d levels needs %d bytes of shared memory, this GPU has %d", s.HeadDim, levels, need, b.opsShare())
	}
	c := &htreeCache{shape: s, row: s.KVHeads * s.HeadDim, off: make([]int32, htMaxLevels), n: make([]int, s.Layers),
		half: len(r.InvFreq), mc: o.MaxCandidates()}
	for l, nodes := 0, s.Capacity; l < levels; l, nodes = l+1, (nodes+o.Rate-1)/o.Rate {
		c.off[l] = int32(c.nodes)
		c.nodes += nodes
	}
	for range s.Layers {
		k, err := b.alloc(4 * c.nodes * c.row)
		if err != nil {
			return nil, err
		}
		v, err := b.alloc(4 * c.nodes * c.row)
		if err != nil {
			return nil, err
		}
		c.k, c.v = append(c.k, k), append(c.v, v)
	}
	cos, sin := make([]float32, c.mc*c.half), make([]float32, c.mc*c.half)
	for p := range c.mc {
		layers.RoPEAngles(cos[p*c.half:(p+1)*c.half], sin[p*c.half:(p+1)*c.half], p, r, false)
	}
	var err error
	if c.cos, err = b.upload(f32Bytes(cos)); err != nil {
		return nil, err
	}
	if c.sin, err = b.upload(f32Bytes(sin)); err != nil {
		return nil, err
	}
	return c, nil
}

// TreeAttention appends k and v to layer's tree (level 0 by copy, the
// changed nodes of every upper level recomputed), then attends level by
// level from the top (ht_score, ht_select, ht_part over tiles of candidates
// for every query head, then ht_combine; see htree.cuh), in waves of htWave
// query heads sharing the cache's scratch.
func (b *Backend) TreeAttention(out, q, k, v backend.Buffer, cache backend.TreeCache, layer, pos0, m int, s layers.AttentionShape) {
	c := cache.(*htreeCache)
	sh := c.shape
	o := sh.Options
	switch {
	case layer < 0 || layer >= len(c.n):
		b.setErr(fmt.Errorf("kernels: htree layer %d of a cache of %d", layer, len(c.n)))
		return
	case s.KVHeads != sh.KVHeads || s.HeadDim != sh.HeadDim || s.Heads <= 0 || s.Heads%s.KVHeads != 0:
		b.setErr(fmt.Errorf("kernels: htree attention shape %+v on a cache of %d KV heads of %d channels", s, sh.KVHeads, sh.HeadDim))
		return
	case m <= 0:
		return
	case pos0 < 0 || pos0 > c.n[layer] || pos0+m > sh.Capacity:
		b.setErr(fmt.Errorf("kernels: htree append of positions [%d, %d) to a tree holding %d of %d", pos0, pos0+m, c.n[layer], sh.Capacity))
		return
	}
	row := c.row
	kl, vl := c.k[layer], c.v[layer]
	b.copyBytes(kl.ptr+uint64(4*pos0*row), ptr(k), 4*m*row)
	b.copyBytes(vl.ptr+uint64(4*pos0*row), ptr(v), 4*m*row)
	c.n[layer] = pos0 + m
	lo, hi, children := pos0, pos0+m-1, c.n[layer]
	for l := 1; l < o.Levels(sh.Capacity); l++ {
		lo, hi = lo/o.Rate, hi/o.Rate
		dst, src := uint64(4*int(c.off[l])*row), uint64(4*int(c.off[l-1])*row)
		b.launch("ht_mean", grid1((hi-lo+1)*row, 256), 256, 0, kl.ptr+dst, vl.ptr+dst, kl.ptr+src, vl.ptr+src,
			lo, hi, o.Rate, children, row)
		children = (children + o.Rate - 1) / o.Rate
	}

	// Levels from the highest top among the rows down to 0; a row whose top
	// is lower skips the levels above it.
	top := o.TopLevel(pos0 + m - 1)
	levels := top + 1
	tiles := (c.mc + htTile - 1) / htTile
	jobs := m * s.Heads
	wave := min(jobs, htWave)
	stride := 3*c.mc + o.TopK
	if err := b.grow(&c.scratch, &c.scrCap, wave*stride); err != nil {
		b.setErr(err)
		return
	}
	if err := b.grow(&c.part, &c.partCap, wave*levels*tiles*(s.HeadDim+2)); err != nil {
		b.setErr(err)
		return
	}
	b.qmu.Lock()
	b.q.keep = append(b.q.keep, c.scratch, c.part)
	b.qmu.Unlock()
	group := s.Heads / s.KVHeads
	for job0 := 0; job0 < jobs; job0 += wave {
		n := min(wave, jobs-job0)
		for lev := top; lev >= 0; lev-- {
			b.launch("ht_score", [3]int{tiles, n, 1}, 256, 4*s.HeadDim, ptr(q), kl.ptr, c.off, c.cos.ptr, c.sin.ptr,
				c.half, boolInt(sh.RoPE.Interleaved), c.scratch.ptr, stride, c.mc, job0, pos0, s.Heads, group,
				s.KVHeads, s.HeadDim, s.Scale, o.Rate, o.TopK, o.TopCandidates, lev)
			if lev > 0 {
				share := 4 * c.mc // the scores' keys in shared memory, when they fit
				if share > b.opsShare() {
					share = 0
				}
				b.launch("ht_select", [3]int{n, 1, 1}, 1024, share, c.scratch.ptr, stride, c.mc, job0, pos0, s.Heads,
					o.Rate, o.TopK, o.TopCandidates, lev, boolInt(share > 0))
			}
			b.launch("ht_part", [3]int{tiles, n, 1}, 128, 0, c.part.ptr, vl.ptr, c.off, c.scratch.ptr, stride, c.mc,
				job0, pos0, s.Heads, group, s.KVHeads, s.HeadDim, o.Rate, o.TopK, o.TopCandidates, levels, tiles, lev)
		}
		b.launch("ht_combine", [3]int{n, 1, 1}, 512, htCombineShare(levels*tiles, s.HeadDim), ptr(out), c.part.ptr,
			job0, pos0, s.Heads, s.HeadDim, o.Rate, o.TopK, o.TopCandidates, levels, tiles)
	}
	runtime.KeepAlive(c)
}
