package htree

import (
	"fmt"

	"github.com/manifoldlm/manifold/layers"
)

// Rotary is a RoPE table for positions [0, Size()): the cos and sin of
// every rotary pair, computed by layers.RoPEAngles (float32 angles, scaled by
// the RoPE's attention factor) exactly as dense attention computes them.
type Rotary struct {
	headDim, half int
	interleaved   bool
	cos, sin      []float32 // [size, half]
}

// NewRotary tabulates r for size positions of headDim-channel heads (the
// rotated channels are the first r.Dim()).
func NewRotary(r *layers.RoPE, headDim, size int) (*Rotary, error) {
	if r == nil || r.Dim() == 0 || r.Dim() > headDim || size <= 0 {
		dim := 0
		if r != nil {
			dim = r.Dim()
		}
		return nil, fmt.Errorf("htree: rotary table of %d positions for %d rotated channels of a %d-channel head", size, dim, headDim)
	}
	half := len(r.InvFreq)
	ro := &Rotary{headDim: headDim, half: half, interleaved: r.Interleaved,
		cos: make([]float32, size*half), sin: make([]float32, size*half)}
	for p := range size {
		layers.RoPEAngles(ro.cos[p*half:(p+1)*half], ro.sin[p*half:(p+1)*half], p, r, false)
	}
	return ro, nil
}

// Size is the number of positions tabulated.
func (ro *Rotary) Size() int { return len(ro.cos) / max(ro.half, 1) }

// Bytes is the table's memory.
func (ro *Rotary) Bytes() int64 { return 4 * int64(len(ro.cos)+len(ro.sin)) }

// Rotate rotates the head vector v (headDim values) to position pos in place.
func (ro *Rotary) Rotate(v []float32, pos int) {
	layers.RotatePairs(v, ro.cos[pos*ro.half:(pos+1)*ro.half], ro.sin[pos*ro.half:(pos+1)*ro.half], ro.interleaved)
}

// Dot is ⟨q, RoPE(k, pos)⟩ for a query q already rotated, without
// materializing the rotated key: over each rotary pair (a, b) of q and k,
// cos·(a₁b₁ + a₂b₂) + sin·(a₂b₁ − a₁b₂), plus the plain dot of the channels
// RoPE leaves alone.
func (ro *Rotary) Dot(q, k []float32, pos int) float32 { return ro.dot(q, k, pos, RoPEDot) }

func (ro *Rotary) dot(q, k []float32, pos int, ropeDot func(qa, qb, ka, kb, cos, sin []float32) float32) float32 {
	h := ro.half
	cos := ro.cos[pos*h : (pos+1)*h]
	sin := ro.sin[pos*h : (pos+1)*h]
	var s float32
	if ro.interleaved {
		q, k := q[:2*h], k[:2*h]
		var s0, s1 float32
		for j := range cos {
			a1, a2, b1, b2 := q[2*j], q[2*j+1], k[2*j], k[2*j+1]
			s0 += cos[j] * (a1*b1 + a2*b2)
			s1 += sin[j] * (a2*b1 - a1*b2)
		}
		s = s0 + s1
	} else {
		s = ropeDot(q[:h], q[h:2*h], k[:h], k[h:2*h], cos, sin)
	}
	if rest := q[2*h : ro.headDim]; len(rest) > 0 {
		kr := k[2*h : ro.headDim]
		for j, x := range rest {
			s += x * kr[j]
		}
	}
	return s
}

// RoPEDot is Σⱼ cos[j]·(qa[j]·ka[j] + qb[j]·kb[j]) + sin[j]·(qb[j]·ka[j] −
// qa[j]·kb[j]) over the len(cos) rotary pairs (qa[j], qb[j]) of a rotated
// query and (ka[j], kb[j]) of a key: the key rotated by (cos, sin), dotted
// with the query. It is the portable version of Kernels.RoPEDot.
func RoPEDot(qa, qb, ka, kb, cos, sin []float32) float32 {
	n := len(cos)
	qa, qb, ka, kb, sin = qa[:n], qb[:n], ka[:n], kb[:n], sin[:n]
	var s0, s1 float32
	for j, c := range cos {
		a1, a2, b1, b2 := qa[j], qb[j], ka[j], kb[j]
		s0 += c * (a1*b1 + a2*b2)
		s1 += sin[j] * (a2*b1 - a1*b2)
	}
	return s0 + s1
}

// Axpy adds a·x to y (len(y) values): the portable version of Kernels.Axpy.
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for j := range y {
		y[j] += a * x[j]
	}
}

// Kernels are the inner loops Attend runs per candidate. A backend may
// supply faster ones computing the same sums (in any order); nil fields
// take the portable RoPEDot and Axpy.
type Kernels struct {
	RoPEDot func(qa, qb, ka, kb, cos, sin []float32) float32
	Axpy    func(y []float32, a float32, x []float32)
}

func (k Kernels) withDefaults() Kernels {
	if k.RoPEDot == nil {
		k.RoPEDot = RoPEDot
	}
	if k.Axpy == nil {
		k.Axpy = Axpy
	}
	return k
}
