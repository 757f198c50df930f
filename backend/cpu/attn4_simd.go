//go:build amd64 || arm64

package cpu

// scores4Kernel and values4Kernel are the assembly kernels: AVX2 in
// attn4_amd64.s, NEON in attn4_arm64.s.
//
//go:noescape
func scores4Kernel(q, k *float32, stride, n, hd int, scale float32, out *float32)

//go:noescape
func values4Kernel(acc, w, v *float32, stride, n, hd int)

// scores4 is scores4Go with the assembly kernel (attn4_amd64.s,
// attn4_arm64.s) where it applies.
func scores4(q, k []float32, stride, n, hd int, scale float32, out []float32) {
	if !attn4Asm(n, hd) {
		scores4Go(q, k, stride, n, hd, scale, out)
		return
	}
	_, _, _ = q[4*hd-1], k[(n-1)*stride+hd-1], out[4*n-1]
	scores4Kernel(&q[0], &k[0], stride, n, hd, scale, &out[0])
}

// values4 is values4Go with the assembly kernel where it applies.
func values4(acc, w, v []float32, stride, n, hd int) {
	if !attn4Asm(n, hd) {
		values4Go(acc, w, v, stride, n, hd)
		return
	}
	_, _, _ = acc[4*hd-1], w[4*n-1], v[(n-1)*stride+hd-1]
	values4Kernel(&acc[0], &w[0], &v[0], stride, n, hd)
}
