// Package mhc holds the reference math of manifold-constrained hyper-connections
// (mHC): the residual stream of width C is widened to n parallel streams, and
// every sub-layer (attention, FFN) reads a weighted collapse of them and writes
// its output back through a learned, doubly stochastic stream mixer.
//
// The computation is split the way a fused GPU implementation splits it (seed
// 000), so that a CUDA kernel can replace each step on its own:
//
//  1. Project: RMS-normalize the flattened n*C stream and project it to the
//     mixing logits (one GEMM with the sum of squares reduced alongside).
//  2. Activate: scale, bias, sigmoid for pre and post, and the residual matrix
//     (Sinkhorn-Knopp, or mHC-lite's convex combination of permutations).
//  3. Pre: collapse the n streams into the sub-layer input.
//  4. Post: mix the streams with the residual matrix and add the sub-layer
//     output, placed by the post weights.
//
// HeadCollapse is the final collapse of the streams before the output norm.
//
// Every function follows transformers' DeepSeek-V4 code (DeepseekV4HyperConnection,
// DeepseekV4HyperHead) operation for operation, eps placements included. The
// functions work on plain []float32 host slices and allocate nothing per call
// beyond what their doc comments state; the package owns no state, reads no
// files and touches no devices.
package mhc

import (
	"fmt"
	"math"
)

// Residual selects how the n×n residual mixing matrix is made doubly stochastic.
type Residual int

const (
	// Sinkhorn is DeepSeek-V4's mHC: softmax of n² logits, then alternating
	// column and row normalizations (Sinkhorn-Knopp), approximately doubly
	// stochastic.
	Sinkhorn Residual = iota
	// Lite is mHC-lite (seed 002): a softmax over n! logits weighs the n!
	// permutation matrices, exactly doubly stochastic by construction.
	Lite
)

// String returns the configuration name of r ("sinkhorn" or "lite").
func (r Residual) String() string {
	switch r {
	case Sinkhorn:
		return "sinkhorn"
	case Lite:
		return "lite"
	}
	return fmt.Sprintf("Residual(%d)", int(r))
}

// ParseResidual maps a configuration string to a Residual. The empty string
// means Sinkhorn, DeepSeek-V4's default.
func ParseResidual(s string) (Residual, error) {
	switch s {
	case "", "sinkhorn":
		return Sinkhorn, nil
	case "lite", "mhc_lite", "mhc-lite":
		return Lite, nil
	}
	return 0, fmt.Errorf("mhc: unknown residual mode %q (supported: sinkhorn, lite)", s)
}

// MaxLiteStreams bounds n for mHC-lite: n! logits and permutation matrices
// grow too fast beyond it (8! = 40320).
const MaxLiteStreams = 8

// Config holds the sizes and constants of one model's hyper-connections.
type Config struct {
	Streams       int      // n: hc_mult
	Hidden        int      // C: hidden_size
	SinkhornIters int      // hc_sinkhorn_iters (Sinkhorn only)
	Eps           float32  // hc_eps: added to pre, to the softmax and to every Sinkhorn denominator
	NormEps       float32  // rms_norm_eps of the unweighted RMS norm of the flattened stream
	Residual      Residual // how the residual matrix is built
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Streams < 1:
		return fmt.Errorf("mhc: hc_mult %d must be at least 1", c.Streams)
	case c.Hidden < 1:
		return fmt.Errorf("mhc: hidden_size %d must be at least 1", c.Hidden)
	case c.Eps < 0 || c.NormEps < 0:
		return fmt.Errorf("mhc: hc_eps %g and rms_norm_eps %g must not be negative", c.Eps, c.NormEps)
	}
	switch c.Residual {
	case Sinkhorn:
		if c.SinkhornIters < 1 {
			return fmt.Errorf("mhc: hc_sinkhorn_iters %d must be at least 1", c.SinkhornIters)
		}
	case Lite:
		if c.Streams > MaxLiteStreams {
			return fmt.Errorf("mhc: mHC-lite needs hc_mult <= %d, got %d", MaxLiteStreams, c.Streams)
		}
	default:
		return fmt.Errorf("mhc: unknown residual mode %d", int(c.Residual))
	}
	return nil
}

// ResDim is the number of residual logits: n² for Sinkhorn, n! for Lite.
func (c Config) ResDim() int {
	if c.Residual == Lite {
		return factorial(c.Streams)
	}
	return c.Streams * c.Streams
}

// MixDim is the number of mixing logits of one site: n pre, n post and the
// residual logits, in that order (the rows of hc_*_fn).
func (c Config) MixDim() int { return 2*c.Streams + c.ResDim() }

// Width is n*C, the length of one token's flattened stream.
func (c Config) Width() int { return c.Streams * c.Hidden }

// Weights are the learned parameters of one hyper-connection site
// (hc_attn_* or hc_ffn_* of a layer).
type Weights struct {
	Fn    []float32 // [MixDim, n*C] row-major: hc_*_fn
	Base  []float32 // [MixDim]: hc_*_base
	Scale []float32 // [3]: hc_*_scale for pre, post, residual
}

// Check reports whether w has the shapes c needs.
func (c Config) Check(w Weights) error {
	mix, width := c.MixDim(), c.Width()
	if len(w.Fn) != mix*width {
		return fmt.Errorf("mhc: fn has %d values, want [%d, %d] (%s residual, hc_mult %d)", len(w.Fn), mix, width, c.Residual, c.Streams)
	}
	if len(w.Base) != mix {
		return fmt.Errorf("mhc: base has %d values, want %d", len(w.Base), mix)
	}
	if len(w.Scale) != 3 {
		return fmt.Errorf("mhc: scale has %d values, want 3", len(w.Scale))
	}
	return nil
}

// HeadWeights are the parameters of the final stream collapse (hc_head).
type HeadWeights struct {
	Fn    []float32 // [n, n*C]: hc_head.hc_fn
	Base  []float32 // [n]: hc_head.hc_base
	Scale float32   // hc_head.hc_scale
}

// CheckHead reports whether h has the shapes c needs.
func (c Config) CheckHead(h HeadWeights) error {
	if len(h.Fn) != c.Streams*c.Width() {
		return fmt.Errorf("mhc: hc_head fn has %d values, want [%d, %d]", len(h.Fn), c.Streams, c.Width())
	}
	if len(h.Base) != c.Streams {
		return fmt.Errorf("mhc: hc_head base has %d values, want %d", len(h.Base), c.Streams)
	}
	return nil
}

// Coeffs holds the mixing coefficients of rows tokens.
type Coeffs struct {
	Pre  []float32 // [rows, n]: weight of stream i in the sub-layer input
	Post []float32 // [rows, n]: weight of the sub-layer output in stream i, in (0, 2)
	// Res is [rows, n, n]: Res[j*n+k] is the weight of input stream j in output
	// stream k. This is the reference's `comb` as it leaves Sinkhorn; the
	// decoder layer consumes it transposed (comb.T @ streams), so rows of Res
	// index inputs and columns index outputs.
	Res []float32
}

// NewCoeffs allocates coefficients for rows tokens.
func (c Config) NewCoeffs(rows int) Coeffs {
	n := c.Streams
	return Coeffs{
		Pre:  make([]float32, rows*n),
		Post: make([]float32, rows*n),
		Res:  make([]float32, rows*n*n),
	}
}

// Mixer runs the hyper-connection math for one Config. It holds only
// read-only tables (mHC-lite's permutations) and is safe for concurrent use.
type Mixer struct {
	cfg   Config
	perms [][]int // Lite only: the n! permutations in lexicographic order
}

// New checks cfg and returns its Mixer.
func New(cfg Config) (*Mixer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Mixer{cfg: cfg}
	if cfg.Residual == Lite {
		m.perms = Permutations(cfg.Streams)
	}
	return m, nil
}

// Config returns the configuration m was built with.
func (m *Mixer) Config() Config { return m.cfg }

// Project is step 1a: for each of rows tokens of x ([rows, n*C]) it writes
// the mixing logits fn·x / sqrt(mean(x²) + NormEps) to logits ([rows, len(fn)/(n*C)]).
// The reference normalizes x first and then projects; projecting first and
// scaling the mix outputs is the same math and is what a fused GEMM+reduce
// kernel does (one pass over x).
func Project(logits, x, fn []float32, rows, width int, normEps float32) {
	mix := len(fn) / width
	for r := 0; r < rows; r++ {
		xr := x[r*width : (r+1)*width]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(width)+float64(normEps)))
		out := logits[r*mix : (r+1)*mix]
		for m := range out {
			out[m] = Dot(fn[m*width:(m+1)*width], xr) * inv
		}
	}
}

// Dot is the float32 inner product of a and b (len(a) values), accumulated in
// eight float32 lanes like a vectorized kernel.
func Dot(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s0, s1, s2, s3, s4, s5, s6, s7 float32
	i := 0
	for ; i+8 <= n; i += 8 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
		s4 += a[i+4] * b[i+4]
		s5 += a[i+5] * b[i+5]
		s6 += a[i+6] * b[i+6]
		s7 += a[i+7] * b[i+7]
	}
	for ; i < n; i++ {
		s0 += a[i] * b[i]
	}
	return ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7))
}

// Activate is step 1b: from the logits of rows tokens ([rows, MixDim]) and the
// site's base and scale it writes the coefficients:
//
//	pre  = sigmoid(logits[:n]*scale[0] + base[:n]) + Eps
//	post = 2*sigmoid(logits[n:2n]*scale[1] + base[n:2n])
//	res  = Sinkhorn(logits[2n:]*scale[2] + base[2n:])    (Sinkhorn)
//	res  = sum_k softmax(logits[2n:]*scale[2] + base[2n:])_k P_k   (Lite)
//
// logits is overwritten (it is the scratch space of the residual step).
func (m *Mixer) Activate(co Coeffs, logits, base, scale []float32, rows int) {
	c := m.cfg
	n, mix := c.Streams, c.MixDim()
	for r := 0; r < rows; r++ {
		l := logits[r*mix : (r+1)*mix]
		pre := co.Pre[r*n : (r+1)*n]
		post := co.Post[r*n : (r+1)*n]
		for i := 0; i < n; i++ {
			pre[i] = Sigmoid(l[i]*scale[0]+base[i]) + c.Eps
			post[i] = 2 * Sigmoid(l[n+i]*scale[1]+base[n+i])
		}
		z := l[2*n:]
		for i := range z {
			z[i] = z[i]*scale[2] + base[2*n+i]
		}
		res := co.Res[r*n*n : (r+1)*n*n]
		if c.Residual == Lite {
			LiteMatrix(res, z, m.perms)
		} else {
			copy(res, z)
			SinkhornKnopp(res, n, c.SinkhornIters, c.Eps)
		}
	}
}

// Coefficients runs steps 1a and 1b for rows tokens of x with the site's
// weights; logits is scratch of rows*MixDim values.
func (m *Mixer) Coefficients(co Coeffs, logits, x []float32, w Weights, rows int) {
	Project(logits, x, w.Fn, rows, m.cfg.Width(), m.cfg.NormEps)
	m.Activate(co, logits, w.Base, w.Scale, rows)
}

// Sigmoid is 1/(1+exp(-x)) in float32, computed without overflow.
func Sigmoid(x float32) float32 {
	if x >= 0 {
		return float32(1 / (1 + math.Exp(-float64(x))))
	}
	e := math.Exp(float64(x))
	return float32(e / (1 + e))
}

// SinkhornKnopp turns the n×n logits in m (row-major) into an approximately
// doubly stochastic matrix, in place, exactly as DeepSeek-V4's reference does:
//
//	m = softmax(m, over each row) + eps
//	m = m / (column sums + eps)
//	repeat iters-1 times:
//	    m = m / (row sums + eps)
//	    m = m / (column sums + eps)
//
// The first softmax is Sinkhorn's first row normalization of exp(m), so with
// eps = 0 this is seed 000's "exp, then iters × (row, column) normalization".
func SinkhornKnopp(m []float32, n, iters int, eps float32) {
	m = m[:n*n]
	for i := 0; i < n; i++ {
		row := m[i*n : (i+1)*n]
		softmax(row)
		for j := range row {
			row[j] += eps
		}
	}
	normCols(m, n, eps)
	for it := 1; it < iters; it++ {
		normRows(m, n, eps)
		normCols(m, n, eps)
	}
}

func normRows(m []float32, n int, eps float32) {
	for i := 0; i < n; i++ {
		row := m[i*n : (i+1)*n]
		var s float32
		for _, v := range row {
			s += v
		}
		s += eps
		for j := range row {
			row[j] /= s
		}
	}
}

func normCols(m []float32, n int, eps float32) {
	for j := 0; j < n; j++ {
		var s float32
		for i := 0; i < n; i++ {
			s += m[i*n+j]
		}
		s += eps
		for i := 0; i < n; i++ {
			m[i*n+j] /= s
		}
	}
}

// LiteMatrix is mHC-lite's residual matrix: dst (n×n, row-major) =
// sum_k softmax(z)_k P_k, with P_k the permutation matrix of perms[k]
// (P_k[i, perms[k][i]] = 1). z (n! logits) is left as the softmax weights.
// The result is a convex combination of permutation matrices, so its rows and
// columns sum to 1 up to float32 rounding of the softmax.
func LiteMatrix(dst, z []float32, perms [][]int) {
	n := len(perms[0])
	softmax(z[:len(perms)])
	clear(dst[:n*n])
	for k, p := range perms {
		a := z[k]
		for i, j := range p {
			dst[i*n+j] += a
		}
	}
}

func softmax(z []float32) {
	mx := z[0]
	for _, v := range z[1:] {
		mx = max(mx, v)
	}
	var s float32
	for i, v := range z {
		e := float32(math.Exp(float64(v - mx)))
		z[i] = e
		s += e
	}
	for i := range z {
		z[i] /= s
	}
}

// Permutations returns the n! permutations of 0..n-1 in lexicographic order
// (the order of Python's itertools.permutations, which mHC-lite's
// implementations use to lay out their n! logits). The identity comes first.
func Permutations(n int) [][]int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	out := make([][]int, 0, factorial(n))
	for {
		out = append(out, append([]int(nil), p...))
		// Next permutation in lexicographic order.
		i := n - 2
		for i >= 0 && p[i] >= p[i+1] {
			i--
		}
		if i < 0 {
			return out
		}
		j := n - 1
		for p[j] <= p[i] {
			j--
		}
		p[i], p[j] = p[j], p[i]
		for a, b := i+1, n-1; a < b; a, b = a+1, b-1 {
			p[a], p[b] = p[b], p[a]
		}
	}
}

func factorial(n int) int {
	f := 1
	for i := 2; i <= n; i++ {
		f *= i
	}
	return f
}

// Pre is step 3: dst[r, c] = sum_i pre[r, i] * x[r, i, c] for rows tokens;
// x is [rows, n, C], pre [rows, n], dst [rows, C].
func Pre(dst, x, pre []float32, rows, n, hidden int) {
	for r := 0; r < rows; r++ {
		out := dst[r*hidden : (r+1)*hidden]
		xs := x[r*n*hidden:]
		w := pre[r*n : (r+1)*n]
		a := w[0]
		for c, v := range xs[:hidden] {
			out[c] = a * v
		}
		for i := 1; i < n; i++ {
			a := w[i]
			for c, v := range xs[i*hidden : (i+1)*hidden] {
				out[c] += a * v
			}
		}
	}
}

// Post is step 4: for rows tokens it writes the new streams
//
//	dst[r, k, c] = post[r, k] * out[r, c] + sum_j res[r, j, k] * x[r, j, c]
//
// (the reference's post·out + combᵀ @ streams). x and dst are [rows, n, C],
// out is [rows, C]; dst may be x (the update is done column by column through
// tmp, which must hold n values).
func Post(dst, x, out, post, res, tmp []float32, rows, n, hidden int) {
	tmp = tmp[:n]
	for r := 0; r < rows; r++ {
		xs := x[r*n*hidden : (r+1)*n*hidden]
		ds := dst[r*n*hidden : (r+1)*n*hidden]
		o := out[r*hidden : (r+1)*hidden]
		p := post[r*n : (r+1)*n]
		h := res[r*n*n : (r+1)*n*n]
		for c := 0; c < hidden; c++ {
			for j := 0; j < n; j++ {
				tmp[j] = xs[j*hidden+c]
			}
			oc := o[c]
			for k := 0; k < n; k++ {
				var acc float32
				for j := 0; j < n; j++ {
					acc += h[j*n+k] * tmp[j]
				}
				ds[k*hidden+c] = p[k]*oc + acc
			}
		}
	}
}

// HeadCollapse is the final collapse (DeepseekV4HyperHead): for rows tokens of
// x ([rows, n, C]) it writes dst[r] = sum_i pre_i x[r, i] with
// pre = sigmoid((hc_fn·x / rms(x)) * scale + base) + Eps. pre is scratch of
// rows*n values and holds the weights on return.
func (m *Mixer) HeadCollapse(dst, x, pre []float32, h HeadWeights, rows int) {
	c := m.cfg
	n := c.Streams
	Project(pre, x, h.Fn, rows, c.Width(), c.NormEps)
	HeadActivate(pre, h.Base, h.Scale, c.Eps, rows, n)
	Pre(dst, x, pre, rows, n, c.Hidden)
}

// Expand writes the initial streams: each of the n streams of token r is a
// copy of emb[r] ([rows, C] into [rows, n, C]).
func Expand(dst, emb []float32, rows, n, hidden int) {
	for r := 0; r < rows; r++ {
		e := emb[r*hidden : (r+1)*hidden]
		for i := 0; i < n; i++ {
			copy(dst[(r*n+i)*hidden:(r*n+i+1)*hidden], e)
		}
	}
}
