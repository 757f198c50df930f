package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/manifoldlm/manifold/layers"
)

// hasAVX512VL is fixed at start-up: AVX-512 F and VL (swigluAVX512).
var hasAVX512VL = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL

//go:noescape
func swigluAVX512(dst, gate, up *float32, n int)

//go:noescape
func swigluAVX2(dst, gate, up *float32, n int)

// swiglu is layers.SwiGLU, bit for bit: without a limit, its multiples of
// 8 in swigluAVX512 where the processor has AVX-512, else its multiples
// of 4 in swigluAVX2.
func swiglu(dst, gate, up []float32, limit float32) {
	wide := hasAVX512VL && !forceAVX2
	n := len(dst) &^ 7
	if !wide {
		n = len(dst) &^ 3
	}
	if limit > 0 || !hasAVX2 || n == 0 {
		layers.SwiGLU(dst, gate, up, limit)
		return
	}
	_, _ = gate[n-1], up[n-1]
	if wide {
		swigluAVX512(&dst[0], &gate[0], &up[0], n)
	} else {
		swigluAVX2(&dst[0], &gate[0], &up[0], n)
	}
	layers.SwiGLU(dst[n:], gate[n:len(dst)], up[n:len(dst)], limit)
}

// swigluGrain is the fewest elements a thread of SwiGLU takes, about 5 µs
// of work: the AVX-512 kernel does 16k elements in that time, so that a
// decode step's 8192 (issue 61's FFN) stay on the caller; the AVX2 kernel
// about 3.6 ns an element (8192 in 29.5 µs against layers.SwiGLU's 194 on
// a 2-core AMD EPYC), so 512 a thread (a decode step's 8192 offer 16
// threads a share each: TestDecodeFanOuts); layers.SwiGLU's math.Exp (no AVX2,
// or a limit) about 25 ns an element: its 8192 were 200 µs a layer on one
// thread, split over all.
func swigluGrain(limit float32) int {
	switch {
	case hasAVX512VL && limit == 0:
		return 1 << 14
	case hasAVX2 && limit == 0:
		return 1 << 9
	}
	return 1 << 8
}
