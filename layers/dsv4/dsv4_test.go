package dsv4

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/layers"
)

// naiveEntry pools one CSA or HCA window in float64 from explicit slot lists.
func naiveEntry(kv, gate, ape []float32, rows []int, slotsApe []int, cols []int, norm []float32) []float64 {
	w := len(norm)
	out := make([]float64, w)
	for c := 0; c < w; c++ {
		mx := math.Inf(-1)
		z := make([]float64, len(rows))
		for i, r := range rows {
			z[i] = float64(gate[r+cols[i]+c]) + float64(ape[slotsApe[i]+cols[i]+c])
			mx = math.Max(mx, z[i])
		}
		num, den := 0.0, 0.0
		for i, r := range rows {
			e := math.Exp(z[i] - mx)
			num += e * float64(kv[r+cols[i]+c])
			den += e
		}
		out[c] = num / den
	}
	ss := 0.0
	for _, v := range out {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(w)+1e-6)
	for c := range out {
		out[c] *= inv * float64(norm[c])
	}
	return out
}

func TestCompress(t *testing.T) {
	cases := []struct {
		name                  string
		entries, rate, width  int
		overlap, prev, rotate bool
		pos0                  int
	}{
		{"hca", 3, 4, 8, false, false, true, 0},
		{"hca later windows", 2, 5, 12, false, false, true, 10},
		{"csa first call", 3, 4, 8, true, false, true, 0},
		{"csa with previous window", 2, 3, 8, true, true, true, 9},
		{"csa one entry no rope", 1, 2, 4, true, false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.entries*100+tc.width)))
			a := CompressArgs{Entries: tc.entries, Rate: tc.rate, Width: tc.width, Overlap: tc.overlap, Prev: tc.prev,
				Pos0: tc.pos0, Eps: 1e-6}
			var rope *layers.RoPE
			if tc.rotate {
				var err error
				rope, err = layers.NewRoPE(layers.RoPEParams{Type: "default", Theta: 1000, PartialRotaryFactor: 0.5}, tc.width)
				if err != nil {
					t.Fatal(err)
				}
				rope.Interleaved = true
				a.RoPE = rope
			}
			rw := a.RowWidth()
			kv := testnum.Normal(rng, a.SourceRows()*rw, 0, 1)
			gate := testnum.Normal(rng, a.SourceRows()*rw, 0, 1)
			ape := testnum.Normal(rng, tc.rate*rw, 0, 0.5)
			norm := testnum.Normal(rng, tc.width, 0, 0.1)
			for i := range norm {
				norm[i]++
			}
			got := make([]float32, tc.entries*tc.width)
			Compress(got, kv, gate, ape, norm, a)

			base := 0
			if tc.prev {
				base = tc.rate
			}
			for e := 0; e < tc.entries; e++ {
				var rows, slots, cols []int
				first := base + e*tc.rate
				if tc.overlap && first >= tc.rate {
					for s := 0; s < tc.rate; s++ {
						rows, slots, cols = append(rows, (first-tc.rate+s)*rw), append(slots, s*rw), append(cols, 0)
					}
				}
				off := 0
				if tc.overlap {
					off = tc.width
				}
				for s := 0; s < tc.rate; s++ {
					rows, slots, cols = append(rows, (first+s)*rw), append(slots, s*rw), append(cols, off)
				}
				want := naiveEntry(kv, gate, ape, rows, slots, cols, norm)
				w32 := make([]float32, len(want))
				for i, v := range want {
					w32[i] = float32(v)
				}
				if rope != nil {
					layers.ApplyRoPE(w32, 1, 1, tc.width, tc.width-rope.Dim(), tc.pos0+e*tc.rate, rope, false)
				}
				if d := testnum.MaxAbsDiff(got[e*tc.width:(e+1)*tc.width], w32); d > 1e-5 {
					t.Errorf("entry %d: max diff %.3g", e, d)
				}
			}
		})
	}
}

func TestIndexTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	a := IndexArgs{M: 6, Heads: 3, Dim: 8, Entries: 5, TopK: 3, Pos0: 9, Rate: 3, Scale: float32(1 / math.Sqrt(8))}
	q := testnum.Normal(rng, a.M*a.Heads*a.Dim, 0, 1)
	keys := testnum.Normal(rng, a.Entries*a.Dim, 0, 1)
	w := testnum.Normal(rng, a.M*a.Heads, 0, 1)
	idx := make([]float32, a.M*a.TopK)
	IndexTopK(idx, q, keys, w, make([]float32, a.Entries), a)
	for i := 0; i < a.M; i++ {
		vis := min(Visible(a.Pos0+i, a.Rate), a.Entries)
		score := func(e int) float64 {
			s := 0.0
			for h := 0; h < a.Heads; h++ {
				d := 0.0
				for c := 0; c < a.Dim; c++ {
					d += float64(q[(i*a.Heads+h)*a.Dim+c]) * float64(keys[e*a.Dim+c])
				}
				s += math.Max(d, 0) * float64(a.Scale) * float64(w[i*a.Heads+h])
			}
			return s
		}
		order := make([]int, vis)
		for e := range order {
			order[e] = e
		}
		slices.SortStableFunc(order, func(x, y int) int {
			if score(x) > score(y) {
				return -1
			} else if score(x) < score(y) {
				return 1
			}
			return 0
		})
		want := order[:min(a.TopK, vis)]
		slices.Sort(want)
		var got []int
		for _, v := range idx[i*a.TopK : (i+1)*a.TopK] {
			if v >= 0 {
				got = append(got, int(v))
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("query %d (visible %d): picks %v, want %v", i, vis, got, want)
		}
		if len(got) < a.TopK && idx[i*a.TopK+len(got)] != -1 {
			t.Errorf("query %d: not padded with -1: %v", i, idx[i*a.TopK:(i+1)*a.TopK])
		}
	}
}

func TestAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	cases := []struct {
		name string
		a    AttnArgs
	}{
		{"sliding", AttnArgs{M: 4, Heads: 2, Dim: 6, Pos0: 7, Lo: 3, Window: 4}},
		{"hca", AttnArgs{M: 3, Heads: 3, Dim: 4, Pos0: 9, Lo: 6, Window: 4, Rate: 4, Entries: 3}},
		{"csa", AttnArgs{M: 3, Heads: 2, Dim: 5, Pos0: 10, Lo: 5, Window: 6, Rate: 2, TopK: 2, Entries: 6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a
			a.Scale = float32(1 / math.Sqrt(float64(a.Dim)))
			q := testnum.Normal(rng, a.M*a.Heads*a.Dim, 0, 1)
			local := testnum.Normal(rng, (a.Pos0+a.M-a.Lo)*a.Dim, 0, 1)
			comp := testnum.Normal(rng, max(a.Entries, 1)*a.Dim, 0, 1)
			sinks := testnum.Normal(rng, a.Heads, 0, 1)
			var idx []float32
			if a.TopK > 0 {
				idx = []float32{1, -1, 0, 3, 4, 2}
			}
			out := make([]float32, len(q))
			Attention(out, q, local, comp, idx, sinks, a, make([]float32, a.MaxKeys()*a.Dim), make([]float32, a.MaxKeys()))
			for i := 0; i < a.M; i++ {
				keys := KeyRows(nil, local, comp, idx, a, i)
				for h := 0; h < a.Heads; h++ {
					qv := q[(i*a.Heads+h)*a.Dim : (i*a.Heads+h+1)*a.Dim]
					den := math.Exp(float64(sinks[h]))
					ws := make([]float64, len(keys))
					for j, k := range keys {
						d := 0.0
						for c := range k {
							d += float64(qv[c]) * float64(k[c])
						}
						ws[j] = math.Exp(d * float64(a.Scale))
						den += ws[j]
					}
					for c := 0; c < a.Dim; c++ {
						want := 0.0
						for j, k := range keys {
							want += ws[j] / den * float64(k[c])
						}
						if got := out[(i*a.Heads+h)*a.Dim+c]; math.Abs(float64(got)-want) > 1e-5 {
							t.Fatalf("query %d head %d channel %d: %g, want %g", i, h, c, got, want)
						}
					}
				}
			}
		})
	}
}

func TestRoute(t *testing.T) {
	logits := []float32{0.5, -1, 2, 0.1, 25, -30}
	bias := []float32{0, 0, -5, 0, 0, 10}
	a := RouteArgs{M: 1, Experts: 6, K: 2, Scale: 1.5}
	idx, w := make([]int32, 2), make([]float32, 2)
	Route(idx, w, logits, bias, nil, a)
	// Scores: sqrt(softplus(x)); expert 5 is picked through its bias alone,
	// expert 2 is dropped through its bias.
	s := func(x float64) float64 {
		if x > 20 {
			return math.Sqrt(x)
		}
		return math.Sqrt(math.Log1p(math.Exp(x)))
	}
	got := map[int32]float32{idx[0]: w[0], idx[1]: w[1]}
	sum := s(25) + s(-30)
	for e, want := range map[int32]float64{4: s(25) / sum * 1.5, 5: s(-30) / sum * 1.5} {
		if v, ok := got[e]; !ok || math.Abs(float64(v)-want) > 1e-6 {
			t.Errorf("expert %d: weight %v (picked %v), want %g", e, v, idx, want)
		}
	}
	// Hash routing takes the table's experts, weighted by their scores.
	Route(idx, w, logits, nil, []int32{1, 3}, a)
	if idx[0] != 1 || idx[1] != 3 {
		t.Errorf("hash routing picked %v, want [1 3]", idx)
	}
	if want := s(-1) / (s(-1) + s(0.1)) * 1.5; math.Abs(float64(w[0])-want) > 1e-6 {
		t.Errorf("hash weight %g, want %g", w[0], want)
	}
	a.Scoring = ScoreSigmoid
	Route(idx, w, logits, nil, []int32{0, 2}, a)
	sg := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	if want := sg(0.5) / (sg(0.5) + sg(2)) * 1.5; math.Abs(float64(w[0])-want) > 1e-6 {
		t.Errorf("sigmoid weight %g, want %g", w[0], want)
	}
	if _, ok := ParseScoring("softmax"); ok {
		t.Error("softmax scoring accepted (transformers' ACT2FN has none)")
	}
}

func TestLayoutMoves(t *testing.T) {
	src := []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11} // [2, 3, 2]
	dst := make([]float32, 12)
	Transpose(dst, src, 2, 3, 2)
	want := []float32{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}
	if !slices.Equal(dst, want) {
		t.Errorf("Transpose = %v, want %v", dst, want)
	}
	g := make([]float32, 4)
	Gather(g, src, []int32{5, 1}, 2)
	if !slices.Equal(g, []float32{10, 11, 2, 3}) {
		t.Errorf("Gather = %v", g)
	}
	acc := make([]float32, 6)
	ScatterAdd(acc, []float32{1, 2, 3, 4}, []int32{2, 0}, []float32{2, -1}, 2)
	if !slices.Equal(acc, []float32{-3, -4, 0, 0, 2, 4}) {
		t.Errorf("ScatterAdd = %v", acc)
	}
}
