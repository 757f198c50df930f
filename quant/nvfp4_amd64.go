package quant

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2/FMA kernels; fixed at start-up from the
// processor's feature flags.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func nvfp4DotAVX2(packed, scales *byte, x *float32, nblocks int, tbl *float32) float32

//go:noescape
func dot4AVX2(w *float32, stride int, x *float32, n int, out *[4]float32)

// matVecRowsAVX2 is MatVecRows with the AVX2 kernel (decoding 16 codes with
// one VPSHUFB, scales from a table of half the E4M3 values since the kernel
// works with 2*e2m1 integers).
func (m *NVFP4) matVecRowsAVX2(dst, x []float32, r0, r1 int) {
	k := m.Cols
	nb := k / NVFP4BlockSize
	half := k / 2
	for r := r0; r < r1; r++ {
		dst[r] = nvfp4DotAVX2(&m.Packed[r*half], &m.Scales[r*nb], &x[0], nb, &e4m3HalfTable[0]) * m.GlobalScale
	}
}

// dot4Rows returns the dot products of x with the 4 rows of buf (row j at
// buf[j*k:]); len(x) == k, a multiple of 16.
func dot4Rows(buf, x []float32, k int) (out [4]float32) {
	if useAVX2 {
		_ = buf[4*k-1]
		dot4AVX2(&buf[0], k, &x[0], k, &out)
		return out
	}
	out[0], out[1], out[2], out[3] = dot4(buf[0:k:k], buf[k:2*k:2*k], buf[2*k:3*k:3*k], buf[3*k:4*k:4*k], x)
	return out
}
