package layers

import (
	"math"
	"slices"
	"testing"
)

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

func TestGroupRoute(t *testing.T) {
	// 8 experts in 4 groups of 2; logits chosen so that the best single
	// expert (3) sits in a weak group and the bias changes the choice.
	logits := []float32{
		0.1, 0.2, 2.0, -3.0, 0.5, 0.6, -1.0, -1.2, // token 0
		-1, -1, -1, -1, -1, -1, 1, 0.9, // token 1
	}
	bias := []float32{0, 0, 0, 0, 0, 0, 0, 0}
	a := GroupRouteArgs{M: 2, Experts: 8, K: 2, Groups: 4, TopKGroups: 2, Normalize: true, Scale: 2.5}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	idx := make([]int32, 4)
	w := make([]float32, 4)
	GroupRoute(idx, w, logits, bias, a)
	// Token 0: group sums (sigmoid): g0 .525+.550, g1 .881+.047, g2 .622+.646, g3 .269+.231
	// -> groups 2 and 0 (g1 = 0.928 < g0 = 1.075 < g2 = 1.268); best experts 5, 4.
	set := func(p []int32) []int32 { q := slices.Clone(p); slices.Sort(q); return q }
	if got := set(idx[:2]); !slices.Equal(got, []int32{4, 5}) {
		t.Fatalf("token 0 experts %v, want [4 5]", got)
	}
	if got := set(idx[2:]); !slices.Equal(got, []int32{6, 7}) {
		t.Fatalf("token 1 experts %v, want [6 7]", got)
	}
	for tok := range 2 {
		var sum float32
		for j := range 2 {
			e := idx[tok*2+j]
			sum += sigmoid(logits[tok*8+int(e)])
		}
		for j := range 2 {
			e := idx[tok*2+j]
			want := sigmoid(logits[tok*8+int(e)]) / (sum + 1e-20) * 2.5
			if math.Abs(float64(w[tok*2+j]-want)) > 1e-6 {
				t.Fatalf("token %d weight %d = %v, want %v", tok, j, w[tok*2+j], want)
			}
		}
	}

	// A bias on expert 3 lifts group 1 and expert 3 into the choice, but the
	// weight is the unbiased score.
	bias[3] = 5
	GroupRoute(idx[:2], w[:2], logits[:8], bias, GroupRouteArgs{M: 1, Experts: 8, K: 2, Groups: 4, TopKGroups: 1, Scale: 1})
	if got := set(idx[:2]); !slices.Equal(got, []int32{2, 3}) {
		t.Fatalf("biased experts %v, want [2 3]", got)
	}
	for j, e := range idx[:2] {
		if want := sigmoid(logits[e]); w[j] != want {
			t.Fatalf("unnormalized weight of expert %d = %v, want %v", e, w[j], want)
		}
	}
}

func TestGroupRouteArgsValidate(t *testing.T) {
	for _, a := range []GroupRouteArgs{
		{Experts: 0, K: 1, Groups: 1, TopKGroups: 1},
		{Experts: 8, K: 9, Groups: 1, TopKGroups: 1},
		{Experts: 8, K: 2, Groups: 3, TopKGroups: 1},
		{Experts: 8, K: 2, Groups: 8, TopKGroups: 1},
		{Experts: 8, K: 2, Groups: 4, TopKGroups: 5},
	} {
		if a.Validate() == nil {
			t.Errorf("%+v accepted", a)
		}
	}
}
