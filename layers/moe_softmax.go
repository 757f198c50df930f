package layers

import (
	"fmt"
	"math"
)

// SoftmaxRouteArgs describes Qwen3-MoE-style MoE routing of M tokens: a
// softmax over the experts, the K most probable, their probabilities as
// weights, renormalized to sum 1 when Normalize.
type SoftmaxRouteArgs struct {
	M         int  // tokens
	Experts   int  // num_experts
	K         int  // num_experts_per_tok
	Normalize bool // norm_topk_prob
}

// Validate reports arguments the router cannot run, naming the config field.
func (a SoftmaxRouteArgs) Validate() error {
	switch {
	case a.Experts <= 0:
		return fmt.Errorf("moe: num_experts = %d, want > 0", a.Experts)
	case a.K <= 0 || a.K > a.Experts:
		return fmt.Errorf("moe: num_experts_per_tok = %d, want in [1, num_experts = %d]", a.K, a.Experts)
	}
	return nil
}

// SoftmaxRoute picks K experts for each of M tokens from router logits
// ([M, Experts], computed in float32) as transformers' Qwen3MoeTopKRouter
// does:
//
//	p = softmax(logits)         (exp and sum in float64, p rounded to float32)
//	idx = torch.topk(p, K)      (sorted, most probable first)
//	w = p[idx]; if Normalize: w /= sum(w)  (the sum in float32, in pick order)
//
// The logits are overwritten with p. idx and weights are [M, K]; scratch
// (may be nil) is TopK's.
func SoftmaxRoute(idx []int32, weights, logits []float32, a SoftmaxRouteArgs, scratch *TopKScratch) {
	E, K := a.Experts, a.K
	for i := range a.M {
		p := logits[i*E : (i+1)*E]
		mx := float32(math.Inf(-1))
		for _, v := range p {
			mx = max(mx, v)
		}
		var sum float64
		for _, v := range p {
			sum += math.Exp(float64(v - mx))
		}
		for e, v := range p {
			p[e] = float32(math.Exp(float64(v-mx)) / sum)
		}
		pick, w := idx[i*K:(i+1)*K], weights[i*K:(i+1)*K]
		TopK(pick, p, K, true, scratch)
		var total float32
		for j, e := range pick {
			w[j] = p[e]
			total += w[j]
		}
		if a.Normalize {
			for j := range w {
				w[j] /= total
			}
		}
	}
}
