//go:build !amd64

package cpu

import "github.com/manifoldlm/manifold/layers"

// swiglu is layers.SwiGLU (assembly on amd64 only).
func swiglu(dst, gate, up []float32, limit float32) { layers.SwiGLU(dst, gate, up, limit) }

// hasAVX512VL: no AVX-512 here.
const hasAVX512VL = false

// swigluGrain is the fewest elements a thread of SwiGLU takes (see the
// amd64 file): layers.SwiGLU's math.Exp, about 25 ns an element.
func swigluGrain(limit float32) int { return 1 << 8 }
