package layers

import (
	"math/rand/v2"
	"testing"
)

// TestPagedAttention holds paged attention to Attention over the same
// positions stored contiguously, for tables out of order and block sizes off
// every multiple of the lengths.
func TestPagedAttention(t *testing.T) {
	s := AttentionShape{Heads: 4, KVHeads: 2, HeadDim: 8, Scale: 0.35}
	for _, tc := range []struct{ bs, pos0, rows, window int }{
		{1, 0, 3, 0}, {3, 5, 1, 0}, {4, 0, 9, 0}, {5, 7, 6, 4}, {16, 2, 2, 0},
	} {
		rng := rand.New(rand.NewPCG(uint64(tc.bs), uint64(tc.pos0)))
		rnd := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = rng.Float32()*2 - 1
			}
			return v
		}
		s.Window = tc.window
		n, width := tc.pos0+tc.rows, s.KVHeads*s.HeadDim
		nb := (n + tc.bs - 1) / tc.bs
		table := make([]int32, nb)
		for i, j := range rng.Perm(nb + 3)[:nb] {
			table[i] = int32(j)
		}
		keys, values, q := rnd(n*width), rnd(n*width), rnd(tc.rows*s.Heads*s.HeadDim)
		kp, vp := make([]float32, (nb+3)*tc.bs*width), make([]float32, (nb+3)*tc.bs*width)
		PagedWrite(kp, keys, table, tc.bs, width, 0, n)
		PagedWrite(vp, values, table, tc.bs, width, 0, n)
		want, got := make([]float32, len(q)), make([]float32, len(q))
		Attention(want, q, keys, values, tc.rows, tc.pos0, s)
		PagedAttention(got, q, kp, vp, []PagedSeq{{Table: table, Pos0: tc.pos0, Rows: tc.rows}}, tc.bs, s)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%+v: out[%d] = %v, want %v", tc, i, got[i], want[i])
			}
		}
	}
}
