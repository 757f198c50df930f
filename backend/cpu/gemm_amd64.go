package cpu

import (
	"sync"

	"golang.org/x/sys/cpu"
)

// hasAVX512 is fixed at start-up: the processor has AVX-512 F and BW, and
// the bf16 kernels use their 16-lane versions.
var hasAVX512 = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW

// forceAVX2 is a test hook: the AVX2 kernels (bf16 matmuls, SwiGLU, the
// attention softmax) even where their AVX-512 forms would run.
var forceAVX2 bool

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
	wide := hasAVX512 && !forceAVX2 && K >= 32
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

// gemmWide is matmulGEMM for a bf16 weight on the AVX-512 kernel, or
// where that does not serve (no AVX-512, K under 32) on gemmPacked; false
// (nothing done) where neither does.
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool {
	K, N := w.cols, w.rows
	k32 := K &^ 31
	if !hasAVX512 || forceAVX2 || k32 == 0 {
		return b.gemmPacked(out, x, w, m)
	}
	b.packedGEMM(out, w, m, (m+5)/6*6*k32,
		func(xp []float32, g0, g1 int) { packWide(xp, x, m, K, k32, g0, g1) }, (m+5)/6,
		func(xp []float32, r0, r1 int) { gemmWideRows(out, x, xp, w.bf16, m, K, N, r0, r1) })
	return true
}

// packedGEMM is the frame of gemmWide and gemmPacked: the tokens' x packed
// once per matmul into a buffer of size floats from widePool (pack, over
// groups of tokens in parallel), then the rows in parallel by quads (rows,
// for rows [r0, r1), r0 a multiple of 4), each chunk's bias added after.
func (b *Backend) packedGEMM(out []float32, w *Weight, m, size int, pack func(xp []float32, g0, g1 int), groups int, rows func(xp []float32, r0, r1 int)) {
	K, N := w.cols, w.rows
	xp, _ := widePool.Get().(*[]float32)
	if xp == nil || cap(*xp) < size {
		xp = new(make([]float32, size))
	}
	*xp = (*xp)[:size]
	b.parallel(groups, 1, func(lo, hi int) { pack(*xp, lo, hi) })
	quads := (N + gemmNR - 1) / gemmNR
	b.parallel(quads, max(1, (1<<14)/(K*m)), func(lo, hi int) {
		r0, r1 := lo*gemmNR, min(hi*gemmNR, N)
		rows(*xp, r0, r1)
		w.addBias(out, m, r0, r1)
	})
	widePool.Put(xp)
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

//go:noescape
func widen4BF16(dst *float32, w *uint16, ldw int, steps int, pf *uint16)

//go:noescape
func gemm4x3F32P(w *float32, x *float32, steps int, out *float32, ldo int, nt int)

// packKC is the values of k a pass of gemmPacked takes: a quad's widened
// rows (8 KiB) and a token group's x (6 KiB) stay in L1 together; packGB
// the token groups a block (126 tokens: their x of a pass, 252 KiB, stays
// in L2 while the thread's quads pass).
var packKC, packGB = 512, 42

// gemmPacked is matmulGEMM for a bf16 weight on AVX2 (no AVX-512): the
// tokens' x packed once per matmul in groups of 3 (8 values of each a
// step), then per block of token groups and pass of k, each quad of rows
// widened to float32 once (widen4BF16) and multiplied with every group of
// the block (gemm4x3F32P, sums added into out); false (nothing done)
// without AVX2 or under 8 columns.
func (b *Backend) gemmPacked(out, x []float32, w *Weight, m int) bool {
	K, N := w.cols, w.rows
	k8 := K &^ 7
	if !hasAVX2 || k8 == 0 {
		return false
	}
	b.packedGEMM(out, w, m, (m+2)/3*3*k8,
		func(xp []float32, g0, g1 int) { packF32(xp, x, m, K, k8, g0, g1) }, (m+2)/3,
		func(xp []float32, r0, r1 int) { gemmPackedRows(out, x, xp, w.bf16, m, K, N, r0, r1) })
	return true
}

// packF32 writes token groups [g0, g1) of x (m tokens of K values) into xp
// as gemm4x3F32P reads them: group g's k8 values in steps of 8, a step the
// 3 tokens' 8 values; tokens past m are zeros.
func packF32(xp, x []float32, m, K, k8, g0, g1 int) {
	for g := g0; g < g1; g++ {
		for t := range 3 {
			i := 3*g + t
			for s := range k8 / 8 {
				d := xp[(g*k8/8+s)*24+t*8:][:8]
				if i >= m {
					clear(d)
				} else {
					copy(d, x[i*K+8*s:])
				}
			}
		}
	}
}

// gemmPackedRows is gemmPacked's product for rows [lo, hi) (lo a multiple
// of 4); the tail of K past the multiple of 8 and the rows past the last 4
// by dot products.
func gemmPackedRows(out, x, xp []float32, w []uint16, m, K, N, lo, hi int) {
	k8 := K &^ 7
	kc := max(8, packKC&^7)
	groups := (m + 2) / 3
	hi4 := lo + (hi-lo)&^3
	for i := range m {
		clear(out[i*N+lo : i*N+hi4])
	}
	scratch := make([]float32, 4*kc)
	for g0 := 0; g0 < groups; g0 += packGB {
		g1 := min(g0+packGB, groups)
		for k0 := 0; k0 < k8; k0 += kc {
			steps := min(kc, k8-k0) / 8
			for r := lo; r < hi4; r += 4 {
				// The next quad's rows of this pass are prefetched (the
				// block's next pass's first ones after the last quad).
				pf := &w[r*K+k0]
				if r+8 <= hi4 {
					pf = &w[(r+4)*K+k0]
				} else if k0+kc < k8 {
					pf = &w[lo*K+k0+kc]
				}
				_ = w[(r+3)*K+k0+8*steps-1]
				widen4BF16(&scratch[0], &w[r*K+k0], K, steps, pf)
				for g := g0; g < g1; g++ {
					nt := min(3, m-3*g)
					_, _ = xp[g*3*k8+(k0+8*steps)*3-1], out[(3*g+nt-1)*N+r+3]
					gemm4x3F32P(&scratch[0], &xp[g*3*k8+k0*3], steps, &out[3*g*N+r], N, nt)
				}
			}
		}
	}
	for i := range m {
		xi := x[i*K : (i+1)*K]
		for r := lo; r < hi; r++ {
			if r < hi4 {
				if k8 < K {
					out[i*N+r] += dotBF16(xi[k8:], w[r*K+k8:(r+1)*K])
				}
			} else {
				out[i*N+r] = dotBF16(xi, w[r*K:(r+1)*K])
			}
		}
	}
}
