//go:build !amd64

package cpu

func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	dot4Q8Go(codes, scales, a, groups, out)
}

func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	row4Q8Go(codes, scales, a, groups, out)
}
