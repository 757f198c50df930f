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
		cs = append(cs, Case{Op: "CompressedAttentionOps.CompressedAttention", Shape: fmt.Sprintf("m=%d/h=%d/d=%d/pos=%d/win=%d/rate=%d/k=%d", s.m, s.heads, s.dim, s.pos0, s.window, s.rate, s.topK), Tol: 2e-5, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				dim := s.dim
				lo := max(0, s.pos0-s.window+1)
				a := dsv4.AttnArgs{M: s.m, Heads: s.heads, Dim: dim, Pos0: s.pos0, Lo: lo, Window: s.window, Rate: s.rate, TopK: s.topK, Entries: s.entries, Scale: float32(1 / math.Sqrt(float64(dim)))}
				q, local, sinks := rnd(rng, s.m*s.heads*dim, 1), rnd(rng, (s.pos0+s.m-lo)*dim, 1), rnd(rng, s.heads, 1)
				comp := rnd(rng, max(1, s.entries)*dim, 1)
				var idx []float32
				var idxB backend.Buffer
				if s.topK > 0 {
					idx = make([]float32, s.m*s.topK)
					for i := range idx {
						idx[i] = -1
					}
					for i := range s.m {
						vis := dsv4.Visible(s.pos0+i, s.rate)
						for j := 0; j < min(s.topK, vis); j++ {
							idx[i*s.topK+j] = float32((j * 7) % vis)
						}
					}
					idxB = upload(b, idx)
				}
				want := make([]float32, len(q))
				dsv4.Attention(want, q, local, comp, idx, sinks, a, make([]float32, a.MaxKeys()*dim), make([]float32, a.MaxKeys()))
				out := b.NewBuffer(len(q))
				caps.Compressed.CompressedAttention(out, upload(b, q), upload(b, local), upload(b, comp), idxB, upload(b, sinks), a)
				return read(b, out), want
			}})
	}
	return cs
}
