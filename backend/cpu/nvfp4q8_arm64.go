package cpu

import "golang.org/x/sys/cpu"

// hasSDOT is fixed at start-up: the processor has the ARMv8.2 dot product
// instructions (FEAT_DotProd: Apple M1 and later, Graviton 2 and later),
// and the int8 kernels use their SDOT versions; without it they multiply
// with SMULL/SMLAL2 (nvfp4q8_arm64.s).
var hasSDOT = hasNEON && cpu.ARM64.HasASIMDDP

// hasVNNI512: no AVX-512 VNNI kernels here.
const hasVNNI512 = false

// q8ForceBase is a test hook: the SMULL kernels even where hasSDOT.
var q8ForceBase bool

// q8BaseName names the kernels q8ForceBase forces, in benchmark names.
const q8BaseName = "neon"

//go:noescape
func dot4Q8SDOT(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)

//go:noescape
func dot4Q8NEON(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)

//go:noescape
func row4Q8SDOT(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)

//go:noescape
func row4Q8NEON(codes, scales *byte, x *int8, xs *float32, groups int, out *[4]float32)

// dot4Q8 is dot4Q8Go with the SDOT or the plain NEON kernel.
func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	if !hasNEON || groups == 0 {
		dot4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[groups*4*q8GroupB-1], scales[groups*4*q8Blocks-1]
	_, _ = a.q[groups*q8Group-1], a.sc[groups*q8Blocks-1]
	if hasSDOT && !q8ForceBase {
		dot4Q8SDOT(&codes[0], &scales[0], &a.q[0], &a.sc[0], groups, out)
		return
	}
	dot4Q8NEON(&codes[0], &scales[0], &a.q[0], &a.sc[0], groups, out)
}

// row4Q8 is row4Q8Go with the SDOT or the plain NEON kernel. The 4 tokens'
// activations must be consecutive in one allocation (newQ8Act).
func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	if !hasNEON || groups == 0 {
		row4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[(groups-1)*4*q8GroupB+q8GroupB-1], scales[(groups-1)*4*q8Blocks+q8Blocks-1]
	x := consecutive(a[0].q, a[3].q, 4, groups*q8Group)
	xs := consecutive(a[0].sc, a[3].sc, 4, groups*q8Blocks)
	if hasSDOT && !q8ForceBase {
		row4Q8SDOT(&codes[0], &scales[0], &x[0], &xs[0], groups, out)
		return
	}
	row4Q8NEON(&codes[0], &scales[0], &x[0], &xs[0], groups, out)
}
