package htree

import "fmt"

// Tree is the htree of one attention layer of one sequence: level 0 holds
// the keys (before RoPE) and values of every position, level l >= 1 the means
// of groups of Rate nodes of level l-1, each [nodes, kvHeads, headDim].
// Memory for capacity positions is allocated up front. A Tree is not safe for
// concurrent use while it is appended to; Attend may read it concurrently.
type Tree struct {
	opts                     Options
	kvHeads, headDim, cap, n int
	k, v                     [][]float32 // per level
}

// NewTree allocates an empty tree for capacity positions of kvHeads heads of
// headDim channels. Zero options take the defaults.
func NewTree(o Options, kvHeads, headDim, capacity int) (*Tree, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if kvHeads <= 0 || headDim <= 0 || capacity <= 0 {
		return nil, fmt.Errorf("htree: tree of %d KV heads, head dim %d, capacity %d: all must be positive", kvHeads, headDim, capacity)
	}
	tr := &Tree{opts: o, kvHeads: kvHeads, headDim: headDim, cap: capacity}
	row := kvHeads * headDim
	for l, nodes := 0, capacity; l < o.Levels(capacity); l, nodes = l+1, ceilDiv(nodes, o.Rate) {
		tr.k = append(tr.k, make([]float32, nodes*row))
		tr.v = append(tr.v, make([]float32, nodes*row))
	}
	return tr, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Options are the tree's parameters, defaults filled in.
func (tr *Tree) Options() Options { return tr.opts }

// Len is the number of positions stored.
func (tr *Tree) Len() int { return tr.n }

// Cap is the number of positions the tree can hold.
func (tr *Tree) Cap() int { return tr.cap }

// KVHeads is the number of key/value heads.
func (tr *Tree) KVHeads() int { return tr.kvHeads }

// HeadDim is the number of channels of a head.
func (tr *Tree) HeadDim() int { return tr.headDim }

// Levels is the number of levels stored, tokens included.
func (tr *Tree) Levels() int { return len(tr.k) }

// Nodes is the number of nodes of level l over the positions stored:
// ceil(Len / Rate^l).
func (tr *Tree) Nodes(l int) int {
	n := tr.n
	for range l {
		n = ceilDiv(n, tr.opts.Rate)
	}
	return n
}

// Keys is level l's keys, [Nodes(l), KVHeads, HeadDim]. The slice aliases
// the tree.
func (tr *Tree) Keys(l int) []float32 { return tr.k[l][:tr.Nodes(l)*tr.kvHeads*tr.headDim] }

// Values is level l's values, [Nodes(l), KVHeads, HeadDim].
func (tr *Tree) Values(l int) []float32 { return tr.v[l][:tr.Nodes(l)*tr.kvHeads*tr.headDim] }

// Bytes is the memory the tree holds (every level at capacity).
func (tr *Tree) Bytes() int64 {
	var b int64
	for l := range tr.k {
		b += 4 * int64(len(tr.k[l])+len(tr.v[l]))
	}
	return b
}

// Truncate drops every position from n on. The nodes that held dropped
// positions are recomputed by the next Append.
func (tr *Tree) Truncate(n int) { tr.n = min(tr.n, max(n, 0)) }

// Append writes the keys (before RoPE) and values of len(k)/(KVHeads*HeadDim)
// positions at pos0.. (dropping any stored from pos0 on), then recomputes
// the nodes of every upper level whose children changed.
func (tr *Tree) Append(k, v []float32, pos0 int) error {
	row := tr.kvHeads * tr.headDim
	if len(k) != len(v) || len(k)%row != 0 {
		return fmt.Errorf("htree: append of %d keys and %d values, want equal multiples of %d (KV heads × head dim)", len(k), len(v), row)
	}
	m := len(k) / row
	if pos0 < 0 || pos0 > tr.n || pos0+m > tr.cap {
		return fmt.Errorf("htree: append of positions [%d, %d) to a tree holding %d of %d", pos0, pos0+m, tr.n, tr.cap)
	}
	tr.n = pos0 + m
	if m == 0 {
		return nil
	}
	copy(tr.k[0][pos0*row:], k)
	copy(tr.v[0][pos0*row:], v)
	r := tr.opts.Rate
	lo, hi, children := pos0, pos0+m-1, tr.n // changed nodes of the level below, and its node count
	for l := 1; l < len(tr.k); l++ {
		lo, hi = lo/r, hi/r
		for node := lo; node <= hi; node++ {
			c0, c1 := node*r, min(node*r+r, children)
			meanRows(tr.k[l][node*row:(node+1)*row], tr.k[l-1][c0*row:c1*row])
			meanRows(tr.v[l][node*row:(node+1)*row], tr.v[l-1][c0*row:c1*row])
		}
		children = ceilDiv(children, r)
	}
	return nil
}

// meanRows sets dst to the mean of the len(src)/len(dst) rows of src, summed
// in order in float32.
func meanRows(dst, src []float32) {
	w := len(dst)
	copy(dst, src[:w])
	for off := w; off < len(src); off += w {
		row := src[off : off+w]
		for j := range dst {
			dst[j] += row[j]
		}
	}
	if cnt := float32(len(src) / w); cnt != 1 {
		for j := range dst {
			dst[j] /= cnt
		}
	}
}
