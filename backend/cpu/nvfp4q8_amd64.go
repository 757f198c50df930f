package cpu

import (
	"golang.org/x/sys/cpu"

	"github.com/manifoldlm/manifold/quant"
)

// hasVNNI512 is fixed at start-up: the processor has AVX-512 (F, BW) and
// AVX-512 VNNI, and the int8 kernels use their VPDPBUSD versions.
var hasVNNI512 = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VNNI

// q8ForceBase is a test hook: the AVX2 kernels even where hasVNNI512.
var q8ForceBase bool

// q8BaseName names the kernels q8ForceBase forces, in benchmark names.
const q8BaseName = "avx2"

// hasSDOT: no arm64 SDOT kernels here.
const hasSDOT = false

// The kernels of nvfp4q8_amd64.s: AVX2 and AVX-512 VNNI for the
// 128-element layout, AVX-512 VNNI for the block-per-lane one.

//go:noescape
func row4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

//go:noescape
func dot4Q8AVX2(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

//go:noescape
func row4Q8VNNI(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

//go:noescape
func dot4Q8VNNI(codes, scales *byte, x *int8, xs *float32, xsum *int32, groups int, out *[4]float32)

//go:noescape
func dot4Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[4]float32)

//go:noescape
func row4Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[4]float32)

//go:noescape
func row8Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups int, out *[8]float32)

//go:noescape
func tile8Q16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups, gc, rows int, out *float32, ldo int, mul float32, acc *float32, flags int)

//go:noescape
func quantQ16AVX512(x *float32, blocks int, q *int8, sc *float32, c *int32)

//go:noescape
func dotsQ16VNNI(codes, scales *byte, x *int8, xs *float32, xc *int32, groups, quads int, out *float32, mul float32)

// dot4Q8 is dot4Q8Go with the AVX-512 VNNI or AVX2 kernel where the
// processor has them.
func dot4Q8(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	if !hasAVX2 || groups == 0 {
		dot4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[groups*4*q8GroupB-1], scales[groups*4*q8Blocks-1]
	if hasVNNI512 && !q8ForceBase {
		_, _, _ = a.x5[groups*q8Group-1], a.sc[groups*q8Blocks-1], a.c5[groups*q8Group/4-1]
		dot4Q8VNNI(&codes[0], &scales[0], &a.x5[0], &a.sc[0], &a.c5[0], groups, out)
		return
	}
	_, _, _ = a.q[groups*q8Group-1], a.sc[groups*q8Blocks-1], a.sum[groups*q8Blocks-1]
	dot4Q8AVX2(&codes[0], &scales[0], &a.q[0], &a.sc[0], &a.sum[0], groups, out)
}

// row4Q8 is row4Q8Go with the AVX-512 VNNI or AVX2 kernel where the
// processor has them. The 4 tokens' activations must be consecutive in one
// allocation (newQ8Act).
func row4Q8(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	if !hasAVX2 || groups == 0 {
		row4Q8Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[(groups-1)*4*q8GroupB+q8GroupB-1], scales[(groups-1)*4*q8Blocks+q8Blocks-1]
	n, nb := groups*q8Group, groups*q8Blocks
	xs := consecutive(a[0].sc, a[3].sc, 4, nb)
	if hasVNNI512 && !q8ForceBase {
		x, xsum := consecutive(a[0].x5, a[3].x5, 4, n), consecutive(a[0].c5, a[3].c5, 4, n/4)
		row4Q8VNNI(&codes[0], &scales[0], &x[0], &xs[0], &xsum[0], groups, out)
		return
	}
	x, xsum := consecutive(a[0].q, a[3].q, 4, n), consecutive(a[0].sum, a[3].sum, 4, nb)
	row4Q8AVX2(&codes[0], &scales[0], &x[0], &xs[0], &xsum[0], groups, out)
}

// useQ16 says whether NVFP4 weights are repacked into the block-per-lane
// layout (nvfp4q16.go), whose kernels need AVX-512 VNNI; q8ForceBase (the
// test hook) keeps the 128-element layout's AVX2 kernels.
func useQ16() bool { return hasVNNI512 && !q8ForceBase }

// dot4Q16 is dot4Q16Go with the AVX-512 VNNI kernel where the processor
// has it.
func dot4Q16(codes, scales []byte, a q16Act, groups int, out *[4]float32) {
	if !hasVNNI512 || groups == 0 {
		dot4Q16Go(codes, scales, a, groups, out)
		return
	}
	_, _ = codes[groups*4*q16GroupB-1], scales[groups*4*q16Blocks-1]
	_, _, _ = a.x[groups*q16Group-1], a.sc[groups*q16Blocks-1], a.c[groups*q16Blocks-1]
	dot4Q16VNNI(&codes[0], &scales[0], &a.x[0], &a.sc[0], &a.c[0], groups, out)
}

// row4Q16 and row8Q16 are row4Q16Go and row8Q16Go with the AVX-512 VNNI
// kernels where the processor has them (tokensQ16).
func row4Q16(codes, scales []byte, a []q16Act, groups int, out *[4]float32) {
	tokensQ16(codes, scales, a, groups, out)
}

func row8Q16(codes, scales []byte, a []q16Act, groups int, out *[8]float32) {
	tokensQ16(codes, scales, a, groups, out)
}

// tokensQ16 is one row with the len(out) tokens of a: row4Q16VNNI or
// row8Q16VNNI where the processor has AVX-512 VNNI, else the portable
// kernel. The tokens' activations must be consecutive in one allocation
// (newQ16Act).
func tokensQ16[O [4]float32 | [8]float32](codes, scales []byte, a []q16Act, groups int, out *O) {
	if !hasVNNI512 || groups == 0 {
		tokensGo(rowQ16Go, codes, scales, a, groups, out)
		return
	}
	_, _ = codes[(groups-1)*4*q16GroupB+q16GroupB-1], scales[(groups-1)*4*q16Blocks+q16Blocks-1]
	k, n, nb := len(*out), groups*q16Group, groups*q16Blocks
	x, xs, xc := consecutive(a[0].x, a[k-1].x, k, n), consecutive(a[0].sc, a[k-1].sc, k, nb), consecutive(a[0].c, a[k-1].c, k, nb)
	switch o := any(out).(type) {
	case *[4]float32:
		row4Q16VNNI(&codes[0], &scales[0], &x[0], &xs[0], &xc[0], groups, o)
	case *[8]float32:
		row8Q16VNNI(&codes[0], &scales[0], &x[0], &xs[0], &xc[0], groups, o)
	}
}

// q16Chunk is the supergroups of a row (2048 elements) that tile8Q16
// takes at a time: the 8 tokens' activations of a chunk, 16 KB and their
// scales, stay in L1 while the tile's rows run over them. Whole rows of
// 8192 (the FFN's down projection) streamed the 8 tokens' 64 KB from L2
// for every row: 120 GFLOP per CPU-second against 190 for rows of 2048
// (DECISIONS.md).
const q16Chunk = 8

// tile8Q16 is prefillQuads with row8Q16 for the 8 tokens acts and the
// quads [q0, q1) of w, in calls of tile8Q16VNNI over up to 32 rows and
// q16Chunk supergroups; false (nothing done) where the processor lacks
// AVX-512 VNNI.
func tile8Q16(out []float32, acts []q16Act, w *quadWeight, q0, q1 int) bool {
	G, N := w.groups, w.rows
	rows := min(4*q1, N) - 4*q0
	if !hasVNNI512 || G == 0 || rows <= 0 {
		return false
	}
	n, nb := G*q16Group, G*q16Blocks
	x, xs, xc := consecutive(acts[0].x, acts[7].x, 8, n), consecutive(acts[0].sc, acts[7].sc, 8, nb), consecutive(acts[0].c, acts[7].c, 8, nb)
	var acc [32 * 8 * 16]float32 // the partial sums of a chunk: 32 rows x 8 tokens x 16 lanes
	const tileRows = len(acc) / (8 * 16)
	for r0 := 0; r0 < rows; r0 += tileRows {
		nr := min(tileRows, rows-r0)
		quad := q0 + r0/4                // r0 is a multiple of 4
		o := out[4*quad : 7*N+4*quad+nr] // row r's token t at t*N + r
		for g0 := 0; g0 < G; g0 += q16Chunk {
			gc := min(q16Chunk, G-g0)
			flags := 0
			if g0 > 0 {
				flags |= 1
			}
			if g0+gc < G {
				flags |= 2
			}
			c := w.codes[(quad*G+g0)*4*q16GroupB : ((quad+(nr+3)/4)*G)*4*q16GroupB]
			s := w.scales[(quad*G+g0)*4*q16Blocks : ((quad+(nr+3)/4)*G)*4*q16Blocks]
			tile8Q16VNNI(&c[0], &s[0], &x[g0*q16Group], &xs[g0*q16Blocks], &xc[g0*q16Blocks], G, gc, nr, &o[0], 4*N, w.mul, &acc[0], flags)
		}
	}
	return true
}

// dotsQ16 is decodeQuads with dot4Q16 for one token a and the quads
// [q0, q1) of w, all 4 rows of each in w (out[4*q0 : 4*q1]), in one call
// of dotsQ16VNNI; false (nothing done) where the processor lacks AVX-512
// VNNI.
func dotsQ16(out []float32, a q16Act, w *quadWeight, q0, q1 int) bool {
	G := w.groups
	if !hasVNNI512 || G == 0 || q1 <= q0 {
		return false
	}
	_, _, _ = a.x[G*q16Group-1], a.sc[G*q16Blocks-1], a.c[G*q16Blocks-1]
	codes := w.codes[q0*G*4*q16GroupB : q1*G*4*q16GroupB]
	scales := w.scales[q0*G*4*q16Blocks : q1*G*4*q16Blocks]
	o := out[4*q0 : 4*q1]
	dotsQ16VNNI(&codes[0], &scales[0], &a.x[0], &a.sc[0], &a.c[0], G, q1-q0, &o[0], w.mul)
	return true
}

// quantizeQ16Fast quantizes the whole blocks of x into a with
// quantQ16AVX512 where the processor has AVX-512 VNNI (the block-per-lane
// layout's machines), the same values as quantizeQ16's, and says how many
// blocks it did.
func quantizeQ16Fast(a q16Act, x []float32, groups int) int {
	n := min(len(x)/quant.NVFP4BlockSize, groups*q16Blocks)
	if !hasVNNI512 || n == 0 {
		return 0
	}
	_, _, _ = a.x[(n-1)/q16Blocks*q16Group+q16Group-1], a.sc[n-1], a.c[n-1]
	quantQ16AVX512(&x[0], n, &a.x[0], &a.sc[0], &a.c[0])
	return n
}
