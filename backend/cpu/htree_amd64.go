package cpu

import "github.com/manifoldlm/manifold/layers/dsa/htree"

//go:noescape
func ropeDotAVX2(qa, qb, ka, kb, cos, sin *float32, n int) float32

// ropeDot is htree.RoPEDot on AVX2/FMA for the pairs in multiples of 8.
func ropeDot(qa, qb, ka, kb, cos, sin []float32) float32 {
	n := len(cos)
	if !hasAVX2 || n < 8 {
		return htree.RoPEDot(qa, qb, ka, kb, cos, sin)
	}
	_, _, _, _, _ = qa[n-1], qb[n-1], ka[n-1], kb[n-1], sin[n-1]
	n8 := n &^ 7
	s := ropeDotAVX2(&qa[0], &qb[0], &ka[0], &kb[0], &cos[0], &sin[0], n8)
	if n8 < n {
		s += htree.RoPEDot(qa[n8:], qb[n8:], ka[n8:], kb[n8:], cos[n8:], sin[n8:])
	}
	return s
}
