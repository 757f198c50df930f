//go:build !amd64 && !arm64

package cpu

import "github.com/manifoldlm/manifold/layers/dsa/htree"

func ropeDot(qa, qb, ka, kb, cos, sin []float32) float32 {
	return htree.RoPEDot(qa, qb, ka, kb, cos, sin)
}
