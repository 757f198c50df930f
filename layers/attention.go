package layers

import "math"

// AttentionShape describes grouped-query attention: heads query heads share
// kvHeads key/value heads (heads % kvHeads == 0), each headDim wide.
type AttentionShape struct {
	Heads, KVHeads, HeadDim int
	Scale                   float32 // applied to q·k; usually 1/sqrt(HeadDim)
	Window                  int     // sliding window in tokens (0: none); a query at p sees keys (p-Window, p]
}

// Attention computes causal attention for m queries at positions pos0..pos0+m-1.
// q is [m, Heads, HeadDim]; keys and values are [n, KVHeads, HeadDim] for
// positions 0..n-1 with n >= pos0+m; out is [m, Heads, HeadDim]. Scores and
// the softmax are computed in float64.
func Attention(out, q, keys, values []float32, m, pos0 int, s AttentionShape) {
	hd := s.HeadDim
	group := s.Heads / s.KVHeads
	scores := make([]float64, pos0+m)
	acc := make([]float64, hd)
	for i := 0; i < m; i++ {
		p := pos0 + i
		lo := 0
		if s.Window > 0 && p-s.Window+1 > 0 {
			lo = p - s.Window + 1
		}
		for h := 0; h < s.Heads; h++ {
			kh := h / group
			qv := q[(i*s.Heads+h)*hd : (i*s.Heads+h+1)*hd]
			mx := math.Inf(-1)
			for t := lo; t <= p; t++ {
				kv := keys[(t*s.KVHeads+kh)*hd : (t*s.KVHeads+kh+1)*hd]
				var d float64
				for j := range qv {
					d += float64(qv[j]) * float64(kv[j])
				}
				d *= float64(s.Scale)
				scores[t] = d
				mx = max(mx, d)
			}
			var sum float64
			for t := lo; t <= p; t++ {
				scores[t] = math.Exp(scores[t] - mx)
				sum += scores[t]
			}
			clear(acc)
			for t := lo; t <= p; t++ {
				w := scores[t] / sum
				vv := values[(t*s.KVHeads+kh)*hd : (t*s.KVHeads+kh+1)*hd]
				for j := range acc {
					acc[j] += w * float64(vv[j])
				}
			}
			o := out[(i*s.Heads+h)*hd : (i*s.Heads+h+1)*hd]
			for j := range o {
				o[j] = float32(acc[j])
			}
		}
	}
}
