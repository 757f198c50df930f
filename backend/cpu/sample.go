package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/backend"
)

// SampleToken is backend.TokenSampler's rule on a host slice: the reference
// the GPU samplers are tested against. The CPU backend itself does not
// implement TokenSampler: on the CPU the engine's own sampler, which reads
// the logits where they already are, does the same work.
func SampleToken(l []float32, temperature float32, topK int, u float64) (int, error) {
	if len(l) == 0 {
		return 0, fmt.Errorf("cpu: sampling from no logits")
	}
	for i, v := range l {
		if v != v {
			return 0, fmt.Errorf("cpu: logit %d is NaN; no token drawn", i)
		}
	}
	if temperature <= 0 {
		best := 0
		for i, v := range l {
			if v > l[best] {
				best = i
			}
		}
		return best, nil
	}
	if topK <= 0 || topK > backend.MaxSampleTopK {
		return 0, fmt.Errorf("cpu: top-k %d outside [1, %d]", topK, backend.MaxSampleTopK)
	}
	ids := make([]int, len(l))
	for i := range ids {
		ids[i] = i
	}
	// Largest first, ties to the lower id.
	slices.SortStableFunc(ids, func(a, c int) int { return cmp.Compare(l[c], l[a]) })
	ids = ids[:min(topK, len(ids))]
	p := make([]float64, len(ids))
	var sum float64
	for i, id := range ids {
		p[i] = math.Exp(float64((l[id] - l[ids[0]]) / temperature))
		sum += p[i]
	}
	r := u * sum
	for i, id := range ids {
		if r < p[i] {
			return id, nil
		}
		r -= p[i]
	}
	return ids[len(ids)-1], nil
}
