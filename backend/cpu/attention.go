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
	keysAll, valuesAll := c.k[layer], c.v[layer]
	o, qs := out.(Buffer), q.(Buffer)
	hd := s.HeadDim
	group := s.Heads / s.KVHeads
	if group%4 == 0 { // 4 query heads of a KV head at a time (attn4.go)
		quads := s.Heads / 4
		stride := s.KVHeads * hd
		// keys is the positions row i attends to, from first(i).
		first := func(i int) int {
			if s.Window > 0 {
				return max(0, pos0+i-s.Window+1)
			}
			return 0
		}
		keys := func(i int) int { return pos0 + i + 1 - first(i) }
		if parts := attnParts(m*quads, b.threads, keys(m-1)); parts > 1 {
			b.attend4Split(o, qs, keysAll, valuesAll, m, quads, parts, group, stride, hd, s.Scale, first, keys)
			return
		}
		b.parallel(m*quads, 1, func(lo, hi int) {
			buf := b.floats(4 * keys(m-1)) // the last row has the most keys
			defer b.scratch.Put(buf)
			sc := *buf
			for job := lo; job < hi; job++ {
				i, h := causalOrder(job/quads, m), job%quads*4
				start := first(i)
				at := (i*s.Heads + h) * hd
				kv := start*stride + h/group*hd
				attend4(o[at:at+4*hd], qs[at:at+4*hd], keysAll[kv:], valuesAll[kv:], stride, keys(i), hd, s.Scale, sc)
			}
		})
		return
	}
	b.parallel(m*s.Heads, 1, func(lo, hi int) {
		buf := b.floats(pos0 + m + hd)
		defer b.scratch.Put(buf)
		scores, acc := (*buf)[:pos0+m], (*buf)[pos0+m:]
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
				d := dotF32(qv, keysAll[(t*s.KVHeads+kh)*hd:(t*s.KVHeads+kh+1)*hd]) * s.Scale
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
				axpyF32(acc, valuesAll[(t*s.KVHeads+kh)*hd:(t*s.KVHeads+kh+1)*hd], wt)
			}
			inv := 1 / sum
			ov := o[at*hd : (at+1)*hd]
			for j := range ov {
				ov[j] = acc[j] * inv
			}
		}
	})
}

// attnMinKeys is the fewest keys a part of a split attention takes: a part
// costs a fan-out's share and its partLen outputs merged, worth it only over
// enough keys.
const attnMinKeys = 64

// attnParts is how many runs of the keys each of units jobs (a query row's
// 4 heads of a KV head) is split into, over n keys: decode has one job a
// KV head (8 for issue 61's model), which leaves half of 16 threads idle, or
// 3 of 6 (parallel's runs of ceil(8/6) = 2 jobs). The jobs times the parts
// is the first multiple of threads, or past 8 runs a thread (where the
// uneven share costs under an eighth), with at least attnMinKeys keys a
// part; 1 (no split) where units already is a multiple of threads, as on 1,
// 2, 4 and 8 threads, and for prompts.
func attnParts(units, threads, n int) int {
	p := 1
	for units*p%threads != 0 && units*p < 8*threads {
		p++
	}
	return max(1, min(p, n/attnMinKeys))
}

// attend4Split is Attention's 4-head path with each job's keys split into
// parts runs (flash-decoding): the units*parts runs go to the threads, each
// writing its attend4Part into a slot of its own, and the caller merges each
// job's parts (mergeParts4). Row i of the m queries attends to keys(i) keys
// from first(i).
func (b *Backend) attend4Split(o, qs, keysAll, valuesAll []float32, m, quads, parts, group, stride, hd int, scale float32, first, keys func(i int) int) {
	heads := 4 * quads
	pl := partLen(hd)
	buf := b.floats(m * quads * parts * pl)
	defer b.scratch.Put(buf)
	part := *buf
	b.parallel(m*quads*parts, 1, func(lo, hi int) {
		var sc *[]float32
		for job := lo; job < hi; job++ {
			u, c := job/parts, job%parts
			i, h := u/quads, u%quads*4
			n := keys(i)
			per := (n + parts - 1) / parts
			t0, t1 := c*per, min((c+1)*per, n)
			slot := part[job*pl : (job+1)*pl]
			if t0 >= t1 { // a short row's last parts: no keys
				clear(slot)
				continue
			}
			if sc == nil { // for the longest part, the last row's
				sc = b.floats(4 * ((keys(m-1) + parts - 1) / parts))
				defer b.scratch.Put(sc)
			}
			at := (i*heads + h) * hd
			kv := (first(i)+t0)*stride + h/group*hd
			var mx, sum [4]float32
			attend4Part(slot[:4*hd], qs[at:at+4*hd], keysAll[kv:], valuesAll[kv:], stride, t1-t0, hd, scale, *sc, &mx, &sum)
			copy(slot[4*hd:], mx[:])
			copy(slot[4*hd+4:], sum[:])
		}
	})
	for u := range m * quads {
		i, h := u/quads, u%quads*4
		at := (i*heads + h) * hd
		mergeParts4(o[at:at+4*hd], part[u*parts*pl:(u+1)*parts*pl], hd)
	}
}
