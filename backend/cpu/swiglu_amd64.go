package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/manifoldlm/manifold/layers"
)

// hasAVX512VL is fixed at start-up: AVX-512 F and VL (swigluAVX512).
var hasAVX512VL = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL

//go:noescape
func swigluAVX512(dst, gate, up *float32, n int)

// swiglu is layers.SwiGLU, bit for bit: without a limit, its multiples of
// 8 in swigluAVX512 where the processor has AVX-512.
func swiglu(dst, gate, up []float32, limit float32) {
	n := len(dst) &^ 7
	if limit > 0 || !hasAVX512VL || n == 0 {
		layers.SwiGLU(dst, gate, up, limit)
		return
	}
	_, _ = gate[n-1], up[n-1]
	swigluAVX512(&dst[0], &gate[0], &up[0], n)
	layers.SwiGLU(dst[n:], gate[n:len(dst)], up[n:len(dst)], limit)
}
