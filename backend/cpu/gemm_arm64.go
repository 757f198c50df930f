package cpu

// has4x3: the NEON 4x3 prefill tiles.
var has4x3 = hasNEON

//go:noescape
func dot4x3BF16(w *uint16, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4x3F32(w *float32, ldw int, x *float32, ldx int, k int, out *[96]float32)

//go:noescape
func dot4BF16NEON(w *uint16, ldw int, x *float32, k int, out *[4]float32)

// matvecBF16 computes out[r] = x · w[r] for rows [lo, hi) of a bf16 matrix
// with K columns: 4 rows a pass (dot4BF16NEON: x loaded once for the 4,
// four streams of weights in flight), the rest and the tail of K in Go.
func matvecBF16(out, x []float32, w []uint16, K, lo, hi int) {
	if !hasNEON {
		matmulBF16(out, x, w, 1, K, len(out), lo, hi)
		return
	}
	k8 := K &^ 7
	var acc [4]float32
	r := lo
	for ; r+4 <= hi && k8 > 0; r += 4 {
		_ = w[(r+3)*K+k8-1]
		dot4BF16NEON(&w[r*K], K, &x[0], k8, &acc)
		for j := range 4 {
			s := acc[j]
			if k8 < K {
				s += dotBF16Go(x[k8:K], w[(r+j)*K+k8:(r+j+1)*K])
			}
			out[r+j] = s
		}
	}
	matmulBF16(out, x, w, 1, K, len(out), r, hi)
}

// forceAVX2 (the amd64 test hook) changes nothing here.
var forceAVX2 bool

// gemmWide (the amd64 AVX-512 bf16 prefill) is not here.
func (b *Backend) gemmWide(out, x []float32, w *Weight, m int) bool { return false }
