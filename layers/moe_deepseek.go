package layers

import (
	"fmt"
	"math"
)

// GroupRouteArgs describes DeepSeek-V3-style MoE routing (also DeepSeek-V3.2's)
// of M tokens: sigmoid scores, a per-expert correction bias used only for
// choosing, group-limited top-k, optional normalization and a scaling factor.
type GroupRouteArgs struct {
	M          int     // tokens
	Experts    int     // n_routed_experts
	K          int     // num_experts_per_tok
	Groups     int     // n_group
	TopKGroups int     // topk_group
	Normalize  bool    // norm_topk_prob
	Scale      float32 // routed_scaling_factor
}

// Validate reports arguments the router cannot run, naming the config field.
func (a GroupRouteArgs) Validate() error {
	switch {
	case a.Experts <= 0:
		return fmt.Errorf("moe: n_routed_experts = %d, want > 0", a.Experts)
	case a.K <= 0 || a.K > a.Experts:
		return fmt.Errorf("moe: num_experts_per_tok = %d, want in [1, n_routed_experts = %d]", a.K, a.Experts)
	case a.Groups <= 0 || a.Experts%a.Groups != 0:
		return fmt.Errorf("moe: n_group = %d must divide n_routed_experts = %d", a.Groups, a.Experts)
	case a.Experts/a.Groups < 2:
		return fmt.Errorf("moe: n_group = %d leaves %d expert(s) per group; group scores need at least 2", a.Groups, a.Experts/a.Groups)
	case a.TopKGroups <= 0 || a.TopKGroups > a.Groups:
		return fmt.Errorf("moe: topk_group = %d, want in [1, n_group = %d]", a.TopKGroups, a.Groups)
	}
	return nil
}

// GroupRoute picks K experts for each of M tokens from router logits
// ([M, Experts], computed in float32) as transformers' DeepseekV3TopkRouter
// (and DeepseekV32TopkRouter) do:
//
//	s = sigmoid(logits); c = s + bias
//	group score = sum of the 2 largest c in the group (Experts/Groups each)
//	keep the TopKGroups best groups (torch.topk); c = -inf outside them
//	picks = torch.topk(c, K) (unsorted); w = s[picks]
//	if Normalize: w /= sum(w) + 1e-20
//	w *= Scale
//
// Selection uses TopK, so ties resolve as in torch. idx and weights are
// [M, K]; bias (e_score_correction_bias, [Experts]) may be nil.
func GroupRoute(idx []int32, weights, logits, bias []float32, a GroupRouteArgs) {
	E, G := a.Experts, a.Groups
	gs := E / G
	s := make([]float32, E)
	c := make([]float32, E)
	gscore := make([]float32, G)
	gpick := make([]int32, a.TopKGroups)
	top2 := make([]int32, 2)
	keep := make([]bool, G)
	var scratch TopKScratch
	for i := range a.M {
		for e, x := range logits[i*E : (i+1)*E] {
			s[e] = float32(1 / (1 + math.Exp(-float64(x))))
			c[e] = s[e]
			if bias != nil {
				c[e] += bias[e]
			}
		}
		for g := range G {
			grp := c[g*gs : (g+1)*gs]
			TopK(top2, grp, 2, true, &scratch)
			gscore[g] = grp[top2[0]] + grp[top2[1]]
		}
		TopK(gpick, gscore, a.TopKGroups, false, &scratch)
		clear(keep)
		for _, g := range gpick {
			keep[g] = true
		}
		for e := range c {
			if !keep[e/gs] {
				c[e] = float32(math.Inf(-1))
			}
		}
		pick := idx[i*a.K : (i+1)*a.K]
		TopK(pick, c, a.K, false, &scratch)
		w := weights[i*a.K : (i+1)*a.K]
		var sum float32
		for j, e := range pick {
			w[j] = s[e]
			sum += w[j]
		}
		if a.Normalize {
			sum += 1e-20
			for j := range w {
				w[j] /= sum
			}
		}
		for j := range w {
			w[j] *= a.Scale
		}
	}
}
