package cpu

//go:noescape
func row4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

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

// row4Q8 is row4Q8Go with the AVX2 kernel where the processor has it. The
// 4 tokens' activations must be consecutive in one allocation (newQ8Act).
func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	if !hasAVX2 || groups == 0 {
		row4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[(groups-1)*4*q8GroupB+q8GroupB-1], scales[(groups-1)*4*q8Blocks+q8Blocks-1]
	x, xs, xsum := a[0].q[:4*groups*q8Group], a[0].sc[:4*groups*q8Blocks], a[0].sum[:4*groups*q8Blocks]
	if &x[3*groups*q8Group] != &a[3].q[0] || &xs[3*groups*q8Blocks] != &a[3].sc[0] || &xsum[3*groups*q8Blocks] != &a[3].sum[0] {
		panic("cpu: row4Q8: the activations are not consecutive")
	}
	row4Q8AVX2(&codes[0], &scales[0], &a[0].q[0], &a[0].sc[0], &a[0].sum[0], groups, out)
}
