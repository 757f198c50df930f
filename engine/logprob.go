package engine

import "math"

// logProbOptions say which log-probabilities Generate reports.
type logProbOptions struct {
	want bool // the chosen token's (Token.LogProb)
	top  int  // that many most likely tokens' (Token.TopLogProbs)
}

// logProbs returns the log-softmax of logits at id and, for top > 0, the
// top most likely tokens (ties: lower id first), computed in float64. A
// logit of +Inf takes all the probability, shared with any other +Inf.
func logProbs(logits []float32, id, top int) (float32, []TokenLogProb) {
	best := math.Inf(-1)
	for _, l := range logits {
		best = max(best, float64(l))
	}
	var lse float64 // log of the sum of exp(logit), of every logit
	switch {
	case math.IsInf(best, 1):
		n := 0
		for _, l := range logits {
			if math.IsInf(float64(l), 1) {
				n++
			}
		}
		lse = math.Log(float64(n)) // each +Inf logit: -log(n); others -Inf
	case math.IsInf(best, -1):
		lse = math.Log(float64(len(logits))) // all -Inf: a uniform draw
	default:
		var sum float64
		for _, l := range logits {
			sum += math.Exp(float64(l) - best)
		}
		lse = best + math.Log(sum)
	}
	lp := func(l float32) float32 {
		switch x := float64(l); {
		case math.IsInf(best, 1):
			if math.IsInf(x, 1) {
				return float32(-lse)
			}
			return float32(math.Inf(-1))
		case math.IsInf(best, -1):
			return float32(-lse)
		default:
			return float32(x - lse)
		}
	}
	if top <= 0 {
		return lp(logits[id]), nil
	}
	// The top ids, most likely first, by insertion into a short sorted list.
	ids := make([]int, 0, top+1)
	for i, l := range logits {
		if len(ids) == top && l <= logits[ids[top-1]] {
			continue
		}
		j := len(ids)
		for j > 0 && l > logits[ids[j-1]] {
			j--
		}
		ids = append(ids, 0)
		copy(ids[j+1:], ids[j:])
		ids[j] = i
		ids = ids[:min(len(ids), top)]
	}
	out := make([]TokenLogProb, len(ids))
	for i, t := range ids {
		out[i] = TokenLogProb{ID: t, LogProb: lp(logits[t])}
	}
	return lp(logits[id]), out
}
