package cpu

import "github.com/manifoldlm/manifold/layers/dsa/htree"

//go:noescape
func axpyF32NEON(y, x *float32, a float32, n int)

//go:noescape
func ropeDotNEON(qa, qb, ka, kb, cos, sin *float32, n int) float32

// axpyF32 adds a·x to y (len(x) values): NEON for the multiple of 4, Go
// for the rest.
func axpyF32(y, x []float32, a float32) {
	n4 := len(x) &^ 3
	if !hasNEON || n4 == 0 {
		axpyF32Go(y, x, a)
		return
	}
	_ = y[len(x)-1]
	axpyF32NEON(&y[0], &x[0], a, n4)
	if n4 < len(x) {
		axpyF32Go(y[n4:], x[n4:], a)
	}
}

// ropeDot is htree.RoPEDot on NEON for the pairs in multiples of 4.
func ropeDot(qa, qb, ka, kb, cos, sin []float32) float32 {
	n := len(cos)
	n4 := n &^ 3
	if !hasNEON || n4 == 0 {
		return htree.RoPEDot(qa, qb, ka, kb, cos, sin)
	}
	_, _, _, _, _ = qa[n-1], qb[n-1], ka[n-1], kb[n-1], sin[n-1]
	s := ropeDotNEON(&qa[0], &qb[0], &ka[0], &kb[0], &cos[0], &sin[0], n4)
	if n4 < n {
		s += htree.RoPEDot(qa[n4:], qb[n4:], ka[n4:], kb[n4:], cos[n4:], sin[n4:])
	}
	return s
}
