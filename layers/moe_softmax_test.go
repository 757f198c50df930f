package layers

import (
	"math"
	"slices"
	"testing"
)

// TestSoftmaxRoute checks the Qwen3-MoE router against its definition:
// softmax, the K most probable (sorted), renormalized or not.
func TestSoftmaxRoute(t *testing.T) {
	for _, tc := range []struct {
		logits    []float32
		K         int
		normalize bool
	}{
		{[]float32{0.1, 2, -1, 0.5, 1.5}, 2, true},
		{[]float32{0.1, 2, -1, 0.5, 1.5}, 3, false},
		{[]float32{3, 2.9, 1, -2}, 1, true},
		{[]float32{-30, 40, 39.5, 0}, 2, false},
	} {
		E := len(tc.logits)
		idx, w := make([]int32, tc.K), make([]float32, tc.K)
		logits := slices.Clone(tc.logits)
		SoftmaxRoute(idx, w, logits, SoftmaxRouteArgs{M: 1, Experts: E, K: tc.K, Normalize: tc.normalize}, nil)
		var z float64
		for _, v := range tc.logits {
			z += math.Exp(float64(v))
		}
		order := make([]int, E)
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int {
			switch {
			case tc.logits[a] > tc.logits[b]:
				return -1
			case tc.logits[a] < tc.logits[b]:
				return 1
			}
			return 0
		})
		var sum float64
		for _, e := range order[:tc.K] {
			sum += math.Exp(float64(tc.logits[e])) / z
		}
		for j, e := range order[:tc.K] {
			want := math.Exp(float64(tc.logits[e])) / z
			if tc.normalize {
				want /= sum
			}
			if int(idx[j]) != e || math.Abs(float64(w[j])-want) > 1e-6 {
				t.Errorf("%v K=%d: pick %d is expert %d weight %g, want %d weight %g", tc.logits, tc.K, j, idx[j], w[j], e, want)
			}
		}
	}
}
