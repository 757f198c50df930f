package cpu

import (
	"sync"

	"golang.org/x/sys/cpu"
)

// hasAVX512 is fixed at start-up: the processor has AVX-512 F and BW, and
// the bf16 kernels use their 16-lane versions.
var hasAVX512 = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW

// bf16ForceAVX2 is a test hook: the AVX2 bf16 kernels even where hasAVX512.
var bf16ForceAVX2 bool

//go:noescape
func dot4BF16AVX512(w *uint16, ldw int, x *float32, k int, out *[32]float32)

// has4x3: the AVX2 4x3 prefill tiles (f32 weights; bf16 without AVX-512,
// or K under 32).
var has4x3 = hasAVX2

//go:noescape
func dot4x3BF16(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4BF16AVX2(w *uint16, ldw int, x *float32, k int, out *[32]float32)

//go:noescape
func dot4x3F32(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)

// matvecBF16 computes out[r] = x · w[r] for rows [lo, hi) of a bf16 matrix
// with K columns: 4 rows a pass (dot4BF16AVX512 or dot4BF16AVX2: x loaded
// once for the 4, four streams of weights in flight), the rest and the tail
// of K in Go.
func matvecBF16(out, x []float32, w []uint16, K, lo, hi int) {
	if !hasAVX2 {
		matmulBF16(out, x, w, 1, K, len(out), lo, hi)
		return
	}
	wide := hasAVX512 && !bf16ForceAVX2 && K >= 32
	k16 := K &^ 15
	if wide {
		k16 = K &^ 31
	}
	var acc [32]float32
	r := lo
	for ; r+4 <= hi && k16 > 0; r += 4 {
		_ = w[(r+3)*K+k16-1]
		if wide {
			dot4BF16AVX512(&w[r*K], K, &x[0], k16, &acc)
		} else {
			dot4BF16AVX2(&w[r*K], K, &x[0], k16, &acc)
		}
		for j := range 4 {
			a := acc[8*j : 8*j+8]
			s := ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
			if k16 < K {
				s += dotBF16Go(x[k16:K], w[(r+j)*K+k16:(r+j+1)*K])
			}
			out[r+j] = s
		}
	}
	matmulBF16(out, x, w, 1, K, len(out), r, hi)
}

//go:noescape
func packWideAVX512(dst *float32, src *float32, steps int)

//go:noescape
func gemm4x6BF16AVX512(w *uint16, ldw int, x *float32, steps int, out *float32, ldo int, nt int, pf *uint16)

//go:noescape
func gemm4x3BF16AVX2(w *uint16, ldw int, x *float32, steps int, out *float32, ldo int, nt int, pf *uint16)

// The wide bf16 prefill (gemmWide): tiles of 4 weight rows by a group of
// tokens, the tokens' x packed once per matmul so that one shift or one
// AND widens a vector of weights (the even elements of a load, or the odd:
// packWide orders x to match). With AVX-512, 6 tokens a group and 32
// values of k a step (gemm4x6BF16AVX512, 24 accumulators); with AVX2, 3
// tokens and 16 (gemm4x3BF16AVX2, 12 accumulators, x read by the FMAs
// from L1). The k values are taken wideKC at a time, so that a token
// group's x (24 or 12 KiB) stays in L1 while it meets a panel of wideNC
// rows, whose wideKC weights (256 KiB) stay in L2 while all the token
// groups meet them: the weights are read from memory once per matmul, the
// activations once per panel.
var wideKC, wideNC = 1024, 128

// widePool holds packWide's buffers between matmuls.
var widePool sync.Pool

// wideKernel is gemmWide's tile: tokens a group, k values a step.
type wideKernel struct {
	tokens, step int
	tile         func(w *uint16, ldw int, x *float32, steps int, out *float32, ldo int, nt int, pf *uint16)
}

var (
	wide512 = wideKernel{6, 32, gemm4x6BF16AVX512}
	wide256 = wideKernel{3, 16, gemm4x3BF16AVX2}
)

// wideOf is the wide kernel of this processor for K columns; ok false
// where none serves (no AVX2, K under a step).
func wideOf(K int) (wideKernel, bool) {
	switch {
	case hasAVX512 && !bf16ForceAVX2 && K >= 32:
		return wide512, true
	case hasAVX2 && K >= 16:
		return wide256, true
	}
	return wideKernel{}, false
}

// gemmWide is matmulGEMM for a bf16 weight on the wide kernels; false
// (nothing done) where they do not serve.
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool {
	K, N := w.cols, w.rows
	wk, ok := wideOf(K)
	if !ok {
		return false
	}
	T, kS := wk.tokens, K/wk.step*wk.step
	groups := (m + T - 1) / T
	size := groups * T * kS
	xp, _ := widePool.Get().(*[]float32)
	if xp == nil || cap(*xp) < size {
		xp = new(make([]float32, size))
	}
	*xp = (*xp)[:size]
	b.parallel(groups, 1, func(lo, hi int) { packWide(wk, *xp, x, m, K, kS, lo, hi) })
	quads := (N + gemmNR - 1) / gemmNR
	b.parallel(quads, max(1, (1<<14)/(K*m)), func(lo, hi int) {
		r0, r1 := lo*gemmNR, min(hi*gemmNR, N)
		gemmWideRows(wk, out, x, *xp, w.bf16, m, K, N, r0, r1)
		w.addBias(out, m, r0, r1)
	})
	widePool.Put(xp)
	return true
}

// packWide writes token groups [g0, g1) of x (m tokens of K values) into
// xp as wk's tile reads them: group g's kS values in steps, a step each
// token's even values of the step then its odd ones; tokens past m are
// zeros.
func packWide(wk wideKernel, xp, x []float32, m, K, kS, g0, g1 int) {
	T, S := wk.tokens, wk.step
	for g := g0; g < g1; g++ {
		for t := range T {
			i := T*g + t
			if i < m && S == 32 {
				_, _ = xp[(g+1)*T*kS-T*S+t*S+S-1], x[i*K+kS-1]
				packWideAVX512(&xp[g*T*kS+t*S], &x[i*K], kS/S)
				continue
			}
			for s := range kS / S {
				d := xp[(g*kS/S+s)*T*S+t*S:][:S]
				if i >= m {
					clear(d)
					continue
				}
				src := x[i*K+s*S:][:S]
				for j := range S / 2 {
					d[j], d[S/2+j] = src[2*j], src[2*j+1]
				}
			}
		}
	}
}

// gemmWideRows is gemmWide's product for rows [lo, hi) (lo a multiple of
// 4): panels of wideNC rows, wideKC values of k a pass, wk's tiles; the
// tail of K past the last step and the rows past the last 4 by dot
// products.
func gemmWideRows(wk wideKernel, out, x, xp []float32, w []uint16, m, K, N, lo, hi int) {
	T, S := wk.tokens, wk.step
	kS := K / S * S
	kc := max(S, wideKC/S*S)
	hi4 := lo + (hi-lo)&^3
	for i := range m {
		clear(out[i*N+lo : i*N+hi4])
	}
	for p0 := lo; p0 < hi4; p0 += wideNC {
		p1 := min(p0+wideNC, hi4)
		for k0 := 0; k0 < kS; k0 += kc {
			steps := min(kc, kS-k0) / S
			// The next block's rows (this panel's next pass, else the
			// next panel's first), one a call, are prefetched into L2
			// while this one runs, so that its first token group does
			// not wait on memory.
			n0, nk, n1 := p0, k0+kc, p1
			if nk >= kS {
				n0, nk, n1 = p1, 0, min(p1+wideNC, hi4)
			}
			for g := range (m + T - 1) / T {
				xg, nt, o := &xp[g*T*kS+k0*T], min(T, m-T*g), T*g*N
				for r := p0; r < p1; r += 4 {
					pf := &w[r*K+k0]
					if n := n0 + g*(p1-p0)/4 + (r-p0)/4; n < n1 {
						pf = &w[n*K+nk]
					}
					wk.tile(&w[r*K+k0], K, xg, steps, &out[o+r], N, nt, pf)
				}
			}
		}
	}
	for i := range m {
		xi := x[i*K : (i+1)*K]
		for r := lo; r < hi; r++ {
			if r < hi4 {
				if kS < K {
					out[i*N+r] += dotBF16(xi[kS:], w[r*K+kS:(r+1)*K])
				}
			} else {
				out[i*N+r] = dotBF16(xi, w[r*K:(r+1)*K])
			}
		}
	}
}
