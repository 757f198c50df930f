package cpu

//go:noescape
func dot4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

// dot4Q8 is dot4Q8Go with the AVX2 kernel where the processor has it.
func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	if !hasAVX2 || groups == 0 {
		dot4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[groups*4*q8GroupB-1], scales[groups*4*q8Blocks-1]
	_, _, _ = a.q[groups*q8Group-1], a.sc[groups*q8Blocks-1], a.sum[groups*q8Blocks-1]
	dot4Q8AVX2(&codes[0], &scales[0], &a.q[0], &a.sc[0], &a.sum[0], groups, out)
}
