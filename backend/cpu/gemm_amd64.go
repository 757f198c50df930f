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

// The AVX-512 bf16 prefill (gemmWide): tiles of 4 weight rows by 6 tokens
// (gemm4x6BF16AVX512, 24 accumulators), the tokens' x packed once per
// matmul so that one VPSLLD or VPANDD widens 16 weights (packWide). The k
// values are taken wideKC at a time, so that a group of 6 tokens' x (24
// KiB) stays in L1 while it meets a panel of wideNC rows, whose wideKC
// weights (256 KiB) stay in L2 while all the token groups meet them: the
// weights are read from memory once per matmul, the activations once per
// panel.
var wideKC, wideNC = 1024, 128

// widePool holds packWide's buffers between matmuls.
var widePool sync.Pool

// gemmWide is matmulGEMM for a bf16 weight on the AVX-512 kernel; false
// (nothing done) where it does not serve (no AVX-512, K under 32).
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool {
	K, N := w.cols, w.rows
	k32 := K &^ 31
	if !hasAVX512 || bf16ForceAVX2 || k32 == 0 {
		return false
	}
	groups := (m + 5) / 6
	size := groups * 6 * k32
	xp, _ := widePool.Get().(*[]float32)
	if xp == nil || cap(*xp) < size {
		xp = new(make([]float32, size))
	}
	*xp = (*xp)[:size]
	b.parallel(groups, 1, func(lo, hi int) { packWide(*xp, x, m, K, k32, lo, hi) })
	quads := (N + gemmNR - 1) / gemmNR
	b.parallel(quads, max(1, (1<<14)/(K*m)), func(lo, hi int) {
		r0, r1 := lo*gemmNR, min(hi*gemmNR, N)
		gemmWideRows(out, x, *xp, w.bf16, m, K, N, r0, r1)
		w.addBias(out, m, r0, r1)
	})
	widePool.Put(xp)
	return true
}

// packWide writes token groups [g0, g1) of x (m tokens of K values) into
// xp as gemm4x6BF16AVX512 reads them: group g's k32 values in steps of 32,
// a step the 6 tokens' 16 even values then 16 odd ones; tokens past m are
// zeros.
func packWide(xp, x []float32, m, K, k32, g0, g1 int) {
	for g := g0; g < g1; g++ {
		for t := range 6 {
			i := 6*g + t
			if i < m {
				_, _ = xp[(g+1)*6*k32-192+t*32+31], x[i*K+k32-1]
				packWideAVX512(&xp[g*6*k32+t*32], &x[i*K], k32/32)
				continue
			}
			for s := range k32 / 32 {
				clear(xp[(g*k32/32+s)*192+t*32:][:32])
			}
		}
	}
}

// gemmWideRows is gemmWide's product for rows [lo, hi) (lo a multiple of
// 4): panels of wideNC rows, wideKC values of k a pass, 4x6 tiles; the
// tail of K past the multiple of 32 and the rows past the last 4 by dot
// products.
func gemmWideRows(out, x, xp []float32, w []uint16, m, K, N, lo, hi int) {
	k32 := K &^ 31
	hi4 := lo + (hi-lo)&^3
	for i := range m {
		clear(out[i*N+lo : i*N+hi4])
	}
	for p0 := lo; p0 < hi4; p0 += wideNC {
		p1 := min(p0+wideNC, hi4)
		for k0 := 0; k0 < k32; k0 += wideKC {
			steps := min(wideKC, k32-k0) / 32
			// The next block's rows (this panel's next pass, else the
			// next panel's first), one a call, are prefetched into L2
			// while this one runs, so that its first token group does
			// not wait on memory.
			n0, nk, n1 := p0, k0+wideKC, p1
			if nk >= k32 {
				n0, nk, n1 = p1, 0, min(p1+wideNC, hi4)
			}
			for g := range (m + 5) / 6 {
				xg, nt, o := &xp[g*6*k32+k0*6], min(6, m-6*g), 6*g*N
				for r := p0; r < p1; r += 4 {
					pf := &w[r*K+k0]
					if n := n0 + g*(p1-p0)/4 + (r-p0)/4; n < n1 {
						pf = &w[n*K+nk]
					}
					gemm4x6BF16AVX512(&w[r*K+k0], K, xg, steps, &out[o+r], N, nt, pf)
				}
			}
		}
	}
	for i := range m {
		xi := x[i*K : (i+1)*K]
		for r := lo; r < hi; r++ {
			if r < hi4 {
				if k32 < K {
					out[i*N+r] += dotBF16(xi[k32:], w[r*K+k32:(r+1)*K])
				}
			} else {
				out[i*N+r] = dotBF16(xi, w[r*K:(r+1)*K])
			}
		}
	}
}
