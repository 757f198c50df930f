//go:build !amd64

package cpu

// hasVNNI512: no AVX-512 VNNI kernels here.
const hasVNNI512 = false

func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	dot4Q8Go(codes, scales, a, groups, out)
}

func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	row4Q8Go(codes, scales, a, groups, out)
}

// q8ForceAVX2 (the amd64 test hook) changes nothing here.
var q8ForceAVX2 bool
