package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// v4AttentionCases are DeepSeek-V4's compressed attention
// (CompressedAttentionOps.CompressedAttention: a sliding window, compressed
// entries dense or picked by the indexer, attention sinks) at the head dims
// the rows of compressedCases (all 64) leave to other kernels on the CUDA
// backend: 512 (V4's own) and 128, multiples of 128, take
// v4_attention_mma16 (with dsa_attend_combine where the keys are split over
// blocks); 192 v4_attention_mma with heads off its groups of 16; 100 (a
// multiple of 4 only) v4_attention4; 70 v4_attention.
func v4AttentionCases() []Case {
	var cs []Case
	for _, s := range []struct{ m, heads, dim, pos0, window, rate, topK, entries int }{
		{1, 16, 512, 300, 128, 4, 32, 75},
		{2, 5, 128, 90, 32, 16, 0, 5},
		{3, 20, 192, 40, 16, 4, 6, 10},
		{3, 4, 100, 37, 16, 4, 6, 9},
		{1, 3, 70, 70, 32, 16, 0, 4},
		{2, 6, 70, 25, 8, 0, 0, 0},
	} {
		cs = append(cs, v4AttentionCase(fmt.Sprintf("m=%d/h=%d/d=%d/pos=%d/win=%d/rate=%d/k=%d", s.m, s.heads, s.dim, s.pos0, s.window, s.rate, s.topK),
			s.m, s.heads, s.dim, s.pos0, s.window, s.rate, s.topK, s.entries))
	}
	return cs
}

// v4AttentionCase is CompressedAttention at one shape: the window's keys,
// entries compressed at rate (picked by topK indices where topK > 0) and the
// sinks, against layers/dsv4.
func v4AttentionCase(shape string, m, heads, dim, pos0, window, rate, topK, entries int) Case {
	return Case{Op: "CompressedAttentionOps.CompressedAttention", Shape: shape, Tol: 2e-5, Needs: "CompressedAttentionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			lo := max(0, pos0-window+1)
			a := dsv4.AttnArgs{M: m, Heads: heads, Dim: dim, Pos0: pos0, Lo: lo, Window: window, Rate: rate, TopK: topK, Entries: entries, Scale: float32(1 / math.Sqrt(float64(dim)))}
			q, local, sinks := rnd(rng, m*heads*dim, 1), rnd(rng, (pos0+m-lo)*dim, 1), rnd(rng, heads, 1)
			comp := rnd(rng, max(1, entries)*dim, 1)
			var idx []float32
			var idxB backend.Buffer
			if topK > 0 {
				idx = make([]float32, m*topK)
				for i := range idx {
					idx[i] = -1
				}
				for i := range m {
					vis := dsv4.Visible(pos0+i, rate)
					for j := 0; j < min(topK, vis); j++ {
						idx[i*topK+j] = float32((j * 7) % vis)
					}
				}
				idxB = upload(b, idx)
			}
			want := make([]float32, len(q))
			dsv4.Attention(want, q, local, comp, idx, sinks, a, make([]float32, a.MaxKeys()*dim), make([]float32, a.MaxKeys()))
			out := b.NewBuffer(len(q))
			caps.Compressed.CompressedAttention(out, upload(b, q), upload(b, local), upload(b, comp), idxB, upload(b, sinks), a)
			return read(b, out), want
		}}
}
