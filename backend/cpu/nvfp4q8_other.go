//go:build !amd64 && !arm64

package cpu

// hasVNNI512, hasSDOT: no AVX-512 VNNI or SDOT kernels here.
const (
	hasVNNI512 = false
	hasSDOT    = false
)

func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	dot4Q8Go(codes, scales, a, groups, out)
}

func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	row4Q8Go(codes, scales, a, groups, out)
}

// q8ForceBase (the amd64 and arm64 test hook) changes nothing here.
var q8ForceBase bool

// q8BaseName names the kernels q8ForceBase forces, in benchmark names.
const q8BaseName = "go"
