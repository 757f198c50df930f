package cpu

import "golang.org/x/sys/cpu"

// hasAVX512 is fixed at start-up: the processor has AVX-512 F and BW, and
// the bf16 kernels use their 16-lane versions.
var hasAVX512 = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW

// bf16ForceAVX2 is a test hook: the AVX2 bf16 kernels even where hasAVX512.
var bf16ForceAVX2 bool

//go:noescape
func dot4x3BF16AVX512(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4BF16AVX512(w *uint16, ldw int, x *float32, k int, out *[32]float32)

//go:noescape
func dot4x3BF16AVX2(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4BF16AVX2(w *uint16, ldw int, x *float32, k int, out *[32]float32)

//go:noescape
func dot4x3F32AVX2(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)

// dot4x3 is dot4x3Go with the AVX-512 or AVX2 kernels where the processor
// has them; k is a multiple of 8. It returns the part of k it covered (the
// bf16 AVX-512 kernel takes multiples of 16; the caller does the rest).
func dot4x3[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) int {
	if !hasAVX2 || k == 0 {
		dot4x3Go(w, ldw, x, ldx, k, out)
		return k
	}
	_, _ = w[3*ldw+k-1], x[2*ldx+k-1]
	switch w := any(w).(type) {
	case []uint16:
		if k16 := k &^ 15; hasAVX512 && !bf16ForceAVX2 && k16 > 0 {
			dot4x3BF16AVX512(&w[0], ldw, &x[0], ldx, k16, out)
			return k16
		}
		dot4x3BF16AVX2(&w[0], ldw, &x[0], ldx, k, out)
	case []float32:
		dot4x3F32AVX2(&w[0], ldw, &x[0], ldx, k, out)
	}
	return k
}

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
