package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// htreeCases are htree's hierarchical sparse attention
// (TreeAttentionOps.TreeAttention) over one layer of a two-layer cache: a
// prefill, two decode steps, then a rewind of two positions and a chunk,
// each call's output against htree.Trees.Attention on host slices with the
// plain kernels. Trees of rates 3 to 5, tops of candidates off the GPU's
// tiles, GQA groups of 1 to 3, partial and interleaved RoPE, head dims 32
// to 64, and the defaults (dense at this length). On the CUDA backend each
// step launches ht_mean (the upper levels of the appended nodes), ht_score,
// ht_select (levels above 0), ht_part and ht_combine.
func htreeCases() []Case {
	return rows([]htreeRow{
		{htree.Options{Rate: 4, TopK: 8, TopCandidates: 16}, 4, 2, 64, 300, 1, false},
		{htree.Options{Rate: 3, TopK: 5, TopCandidates: 7}, 3, 1, 48, 200, 0.5, true},
		{htree.Options{Rate: 5, TopK: 6, TopCandidates: 37}, 6, 2, 40, 420, 1, false},
		{htree.Options{}, 2, 2, 32, 150, 1, false},
	}, htreeCase)
}

// htreeRow is a cache of capa positions with trees of opts, attended by
// heads query heads over kv KV heads of width hd, RoPE partial and
// interleaved or not.
type htreeRow struct {
	opts                htree.Options
	heads, kv, hd, capa int
	partial             float64
	interleaved         bool
}

func htreeCase(s htreeRow) Case {
	shape := fmt.Sprintf("h=%d/kv=%d/d=%d/cap=%d/rate=%d/k=%d/top=%d/rope=%g/inter=%v", s.heads, s.kv, s.hd, s.capa, s.opts.Rate, s.opts.TopK, s.opts.TopCandidates, s.partial, s.interleaved)
	return Case{Op: "TreeAttentionOps.TreeAttention", Shape: shape, Tol: 1e-5, Needs: "TreeAttentionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			rope := must(layers.NewRoPE(layers.RoPEParams{Theta: 10000, PartialRotaryFactor: s.partial}, s.hd))
			rope.Interleaved = s.interleaved
			cshape := htree.CacheShape{Layers: 2, KVHeads: s.kv, HeadDim: s.hd, Capacity: s.capa, Options: s.opts, RoPE: rope}
			ref := must(htree.NewTrees(cshape))
			tc := must(caps.TreeAttention.NewTreeCache(cshape))
			as := layers.AttentionShape{Heads: s.heads, KVHeads: s.kv, HeadDim: s.hd, Scale: float32(1 / math.Sqrt(float64(s.hd)))}
			var got, want []float32
			for si, st := range [][2]int{{0, s.capa - 60}, {s.capa - 60, 1}, {s.capa - 59, 1}, {s.capa - 58, 37}} {
				pos0, m := st[0], st[1]
				if si == 3 { // rewind two positions and go on from there
					pos0 -= 2
					ref.Truncate(pos0)
					tc.Truncate(pos0)
				}
				q, k, v := rnd(rng, m*s.heads*s.hd, 1), rnd(rng, m*s.kv*s.hd, 1), rnd(rng, m*s.kv*s.hd, 1)
				w := make([]float32, len(q))
				if err := ref.Attention(w, q, k, v, 1, pos0, m, as, nil, htree.Kernels{}); err != nil {
					panic(err)
				}
				want = append(want, w...)
				out := b.NewBuffer(len(q))
				caps.TreeAttention.TreeAttention(out, upload(b, q), upload(b, k), upload(b, v), tc, 1, pos0, m, as)
				got = append(got, read(b, out)...)
			}
			return got, want
		}}
}
