// Package dsv4 holds the reference math specific to DeepSeek-V4's attention
// and MoE: the compressors of compressed sparse attention (CSA) and heavily
// compressed attention (HCA), the lightning indexer's top-k over compressed
// entries, attention with per-head sinks over a shared key/value set (a
// sliding window plus compressed entries), the sqrtsoftplus and hash routers,
// and the small layout moves the model needs (group transposes, expert
// gather and scatter).
//
// Like package layers it works on plain []float32 host slices and is the
// specification the backends' kernels are tested against; the formulas are
// those of transformers 5.17's modeling_deepseek_v4.py (docs/deepseek_v4.md
// states them). Ops is the interface a backend implements to run them on its
// device. The package owns no state and touches no files or devices: the
// per-sequence compressor state lives in the model's cache.
package dsv4

import (
	"math"

	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
)

// CompressArgs describes one compressor call: Entries windows of Rate source
// rows each are pooled into Entries compressed entries of Width values.
//
// The source rows (kv and gate) hold RowWidth() values each: Width for HCA,
// 2*Width for CSA (Overlap), whose first Width values (Ca) belong to the
// next window's entry and last Width values (Cb) to the row's own window.
// With Prev (CSA only) the source starts with the Rate rows of the window
// before the first one, whose Ca halves feed entry 0; without it entry 0's Ca
// slots are empty (the reference's -inf gates).
type CompressArgs struct {
	Entries, Rate, Width int
	Overlap, Prev        bool
	Pos0                 int // source position of the first pooled window's first row (a multiple of Rate)
	Eps                  float32
	RoPE                 *layers.RoPE // rotates the last RoPE.Dim() values of each entry at its window's first position
}

// RowWidth is the width of one source row.
func (a CompressArgs) RowWidth() int {
	if a.Overlap {
		return 2 * a.Width
	}
	return a.Width
}

// SourceRows is the number of source rows the call reads.
func (a CompressArgs) SourceRows() int {
	n := a.Entries * a.Rate
	if a.Prev {
		n += a.Rate
	}
	return n
}

// Compress pools, normalizes and rotates compressed entries:
//
//	z_s     = gate_s + ape[s mod Rate]                       (per channel)
//	e       = sum_s softmax_s(z) * kv_s                      (over the window's slots)
//	dst[w]  = RoPE(RMSNorm_norm(e), Pos0 + w*Rate)
//
// where the slots of entry w are the Rate rows of window w (HCA), or the Ca
// halves of window w-1's rows followed by the Cb halves of window w's rows
// (CSA). kv and gate are [SourceRows, RowWidth], ape is [Rate, RowWidth]
// (the checkpoint's compressor.ape), norm is [Width], dst is [Entries, Width].
// The softmax runs in float32 like the reference's.
func Compress(dst, kv, gate, ape, norm []float32, a CompressArgs) {
	rw, w := a.RowWidth(), a.Width
	base := 0
	if a.Prev {
		base = a.Rate
	}
	slots := a.Rate
	if a.Overlap {
		slots = 2 * a.Rate
	}
	z := make([]float32, slots)
	v := make([]float32, slots)
	for e := 0; e < a.Entries; e++ {
		out := dst[e*w : (e+1)*w]
		first := base + e*a.Rate // first source row of window e
		for c := 0; c < w; c++ {
			n := 0
			if a.Overlap {
				if first-a.Rate >= 0 { // Ca halves of the previous window
					for s := 0; s < a.Rate; s++ {
						r := first - a.Rate + s
						z[n] = gate[r*rw+c] + ape[s*rw+c]
						v[n] = kv[r*rw+c]
						n++
					}
				}
				for s := 0; s < a.Rate; s++ { // Cb halves of this window
					r := first + s
					z[n] = gate[r*rw+w+c] + ape[s*rw+w+c]
					v[n] = kv[r*rw+w+c]
					n++
				}
			} else {
				for s := 0; s < a.Rate; s++ {
					r := first + s
					z[n] = gate[r*rw+c] + ape[s*rw+c]
					v[n] = kv[r*rw+c]
					n++
				}
			}
			out[c] = pool(z[:n], v[:n])
		}
		layers.RMSNorm(out, out, norm, a.Eps)
		if a.RoPE != nil {
			layers.ApplyRoPE(out, 1, 1, w, w-a.RoPE.Dim(), a.Pos0+e*a.Rate, a.RoPE, false)
		}
	}
}

// pool is sum_s softmax(z)_s * v_s in float32.
func pool(z, v []float32) float32 {
	mx := z[0]
	for _, x := range z[1:] {
		mx = max(mx, x)
	}
	var sum, acc float32
	for s, x := range z {
		e := float32(math.Exp(float64(x - mx)))
		sum += e
		acc += e * v[s]
	}
	return acc / sum
}

// Visible is the number of compressed entries (compression rate m) a query
// at position pos may see: the windows closed by pos, floor((pos+1)/m).
func Visible(pos, m int) int { return (pos + 1) / m }

// IndexArgs describes the lightning indexer for M queries at positions
// Pos0..Pos0+M-1 over Entries compressed keys of rate Rate.
type IndexArgs struct {
	M, Heads, Dim, Entries, TopK, Pos0, Rate int
	Scale                                    float32 // Dim^-1/2, applied inside every ReLU term
}

// IndexTopK writes, for each query i, the compressed entries it attends to:
//
//	score_w = sum_h weights[i,h] * ReLU(q[i,h] · keys[w]) * Scale   (w visible)
//	        = -Inf                                                  (w not visible)
//
// then the torch.topk set of min(TopK, Entries) scores, dropping picks that
// are not visible, in increasing order. q is [M, Heads, Dim] (rotated),
// weights [M, Heads] (already times Heads^-1/2), keys [Entries, Dim];
// idx is [M, TopK] and receives the indices as float32 values (exact below
// 2^24), padded with -1. scores must hold Entries values.
func IndexTopK(idx, q, keys, weights, scores []float32, a IndexArgs) {
	k := min(a.TopK, a.Entries)
	sel := make([]int32, k)
	var scratch layers.TopKScratch
	for i := 0; i < a.M; i++ {
		vis := min(Visible(a.Pos0+i, a.Rate), a.Entries)
		row := scores[:a.Entries]
		for w := range row {
			if w >= vis {
				row[w] = float32(math.Inf(-1))
				continue
			}
			kw := keys[w*a.Dim : (w+1)*a.Dim]
			var s float32
			for h := 0; h < a.Heads; h++ {
				d := dot(q[(i*a.Heads+h)*a.Dim:(i*a.Heads+h+1)*a.Dim], kw)
				if d > 0 {
					s += d * a.Scale * weights[i*a.Heads+h]
				}
			}
			row[w] = s
		}
		out := idx[i*a.TopK : (i+1)*a.TopK]
		for j := range out {
			out[j] = -1
		}
		if k == 0 {
			continue
		}
		for j, w := range dsa.Select(sel, row, vis, k, &scratch) {
			out[j] = float32(w)
		}
	}
}

// AttnArgs describes V4 attention for M queries at positions Pos0..Pos0+M-1.
//
// Local holds the rows of positions Lo..Pos0+M-1 (the sliding-window keys:
// the cached tail and the new tokens); a query at p sees those with
// p-Window < position <= p. Compressed entries come after them: with TopK > 0
// the rows of Comp listed in Idx (CSA), otherwise the first Visible(p, Rate)
// rows of Comp (HCA; Rate 0 means no compressed entries, a sliding layer).
type AttnArgs struct {
	M, Heads, Dim       int
	Pos0, Lo, Window    int
	Rate, TopK, Entries int
	Scale               float32 // Dim^-1/2
}

// Attention is DeepSeek-V4's attention (shared key/value, per-head sinks):
// for each query i and head h, over its visible key rows kv_j
//
//	s_j      = (q[i,h] · kv_j) * Scale
//	out[i,h] = sum_j exp(s_j) kv_j / (sum_j exp(s_j) + exp(sinks[h]))
//
// q and out are [M, Heads, Dim], local is [Pos0+M-Lo, Dim], comp [Entries,
// Dim], idx [M, TopK] (float-coded, -1 padded; nil unless TopK > 0), sinks
// [Heads]. keys is scratch of (Window + TopK or Entries) * Dim values and
// scores of as many values without the Dim factor.
func Attention(out, q, local, comp, idx, sinks []float32, a AttnArgs, keys, scores []float32) {
	for i := 0; i < a.M; i++ {
		n := GatherKeys(keys, local, comp, idx, a, i)
		SinkAttention(out[i*a.Heads*a.Dim:(i+1)*a.Heads*a.Dim], q[i*a.Heads*a.Dim:(i+1)*a.Heads*a.Dim],
			keys, sinks, scores, a.Heads, a.Dim, n, a.Scale)
	}
}

// MaxKeys is the most key rows one query of a can see.
func (a AttnArgs) MaxKeys() int {
	n := a.Window
	if a.TopK > 0 {
		n += a.TopK
	} else if a.Rate > 0 {
		n += a.Entries
	}
	return n
}

// GatherKeys copies the key rows query i of a sees into keys and returns
// their number.
func GatherKeys(keys, local, comp, idx []float32, a AttnArgs, i int) int {
	p := a.Pos0 + i
	lo := max(a.Lo, p-a.Window+1)
	n := copy(keys, local[(lo-a.Lo)*a.Dim:(p-a.Lo+1)*a.Dim]) / a.Dim
	switch {
	case a.TopK > 0:
		for _, w := range idx[i*a.TopK : (i+1)*a.TopK] {
			if w < 0 {
				continue
			}
			r := int(w)
			copy(keys[n*a.Dim:], comp[r*a.Dim:(r+1)*a.Dim])
			n++
		}
	case a.Rate > 0:
		vis := min(Visible(p, a.Rate), a.Entries)
		n += copy(keys[n*a.Dim:], comp[:vis*a.Dim]) / a.Dim
	}
	return n
}

// KeyRows appends to rows the key rows query i sees, in place in local and
// comp, in the order GatherKeys copies them.
func KeyRows(rows [][]float32, local, comp, idx []float32, a AttnArgs, i int) [][]float32 {
	p := a.Pos0 + i
	for s := max(a.Lo, p-a.Window+1); s <= p; s++ {
		rows = append(rows, local[(s-a.Lo)*a.Dim:(s-a.Lo+1)*a.Dim])
	}
	switch {
	case a.TopK > 0:
		for _, w := range idx[i*a.TopK : (i+1)*a.TopK] {
			if w >= 0 {
				rows = append(rows, comp[int(w)*a.Dim:(int(w)+1)*a.Dim])
			}
		}
	case a.Rate > 0:
		for w := 0; w < min(Visible(p, a.Rate), a.Entries); w++ {
			rows = append(rows, comp[w*a.Dim:(w+1)*a.Dim])
		}
	}
	return rows
}

// SinkAttention is attention of one query over entries shared key/value rows
// with a per-head sink logit: q and out are [heads, dim], kv [entries, dim],
// sinks [heads], scores scratch of entries values. Scores and the softmax are
// float32 like the reference's eager path.
func SinkAttention(out, q, kv, sinks, scores []float32, heads, dim, entries int, scale float32) {
	for h := 0; h < heads; h++ {
		qh := q[h*dim : (h+1)*dim]
		mx := sinks[h]
		for j := 0; j < entries; j++ {
			s := dot(qh, kv[j*dim:(j+1)*dim]) * scale
			scores[j] = s
			mx = max(mx, s)
		}
		sum := float32(math.Exp(float64(sinks[h] - mx)))
		for j := 0; j < entries; j++ {
			e := float32(math.Exp(float64(scores[j] - mx)))
			scores[j] = e
			sum += e
		}
		o := out[h*dim : (h+1)*dim]
		clear(o)
		inv := 1 / sum
		for j := 0; j < entries; j++ {
			p := scores[j] * inv
			for c, v := range kv[j*dim : (j+1)*dim] {
				o[c] += p * v
			}
		}
	}
}

// SqrtSoftplus is sqrt(softplus(x)), DeepSeek-V4's router score; softplus
// follows torch (x itself above 20).
func SqrtSoftplus(x float32) float32 {
	if x > 20 {
		return float32(math.Sqrt(float64(x)))
	}
	return float32(math.Sqrt(math.Log1p(math.Exp(float64(x)))))
}

// Scoring is a router scoring function.
type Scoring int

// The scoring functions transformers' ACT2FN offers that V4 configs use.
const (
	ScoreSqrtSoftplus Scoring = iota
	ScoreSigmoid
)

// ParseScoring maps scoring_func to a Scoring; ok is false for other names.
func ParseScoring(s string) (sc Scoring, ok bool) {
	switch s {
	case "sqrtsoftplus":
		return ScoreSqrtSoftplus, true
	case "sigmoid":
		return ScoreSigmoid, true
	}
	return 0, false
}

// RouteArgs describes routing M tokens over Experts experts, K per token.
type RouteArgs struct {
	M, Experts, K int
	Scoring       Scoring
	Scale         float32 // routed_scaling_factor
}

// Route picks experts for M tokens from router logits ([M, Experts]):
// scores = score(logits); with hash (the [M, K] rows of tid2eid for the
// tokens) the experts are the hashed ones, otherwise the torch.topk set of
// scores + bias (bias may be nil). weights[i, j] = scores of the picks,
// normalized to sum 1 (+1e-20) and times Scale. idx (int32) and weights are
// [M, K].
func Route(idx []int32, weights, logits, bias []float32, hash []int32, a RouteArgs) {
	s := make([]float32, a.Experts)
	sel := make([]float32, a.Experts)
	var scratch layers.TopKScratch
	for i := 0; i < a.M; i++ {
		for e, x := range logits[i*a.Experts : (i+1)*a.Experts] {
			if a.Scoring == ScoreSigmoid {
				s[e] = float32(1 / (1 + math.Exp(-float64(x))))
			} else {
				s[e] = SqrtSoftplus(x)
			}
		}
		pick := idx[i*a.K : (i+1)*a.K]
		if hash != nil {
			copy(pick, hash[i*a.K:(i+1)*a.K])
		} else {
			for e := range sel {
				sel[e] = s[e]
				if bias != nil {
					sel[e] += bias[e]
				}
			}
			layers.TopK(pick, sel, a.K, false, &scratch)
		}
		w := weights[i*a.K : (i+1)*a.K]
		var sum float32
		for j, e := range pick {
			w[j] = s[e]
			sum += w[j]
		}
		sum += 1e-20
		for j := range w {
			w[j] = w[j] / sum * a.Scale
		}
	}
}

// Transpose swaps the two outer axes of src ([a, b, w] row-major) into dst
// ([b, a, w]).
func Transpose(dst, src []float32, a, b, w int) {
	for i := 0; i < a; i++ {
		for j := 0; j < b; j++ {
			copy(dst[(j*a+i)*w:(j*a+i+1)*w], src[(i*b+j)*w:(i*b+j+1)*w])
		}
	}
}

// Gather copies rows[i] of src ([*, w]) to row i of dst.
func Gather(dst, src []float32, rows []int32, w int) {
	for i, r := range rows {
		copy(dst[i*w:(i+1)*w], src[int(r)*w:(int(r)+1)*w])
	}
}

// ScatterAdd adds scale[i] * row i of src to row rows[i] of dst ([*, w]).
func ScatterAdd(dst, src []float32, rows []int32, scale []float32, w int) {
	for i, r := range rows {
		d := dst[int(r)*w : (int(r)+1)*w]
		a := scale[i]
		for c, v := range src[i*w : (i+1)*w] {
			d[c] += a * v
		}
	}
}

func dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}
