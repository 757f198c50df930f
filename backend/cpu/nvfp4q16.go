package cpu

import "github.com/manifoldlm/manifold/quant"

// The block-per-lane NVFP4 layout (q16Weight) for the AVX-512 VNNI kernels:
// the same codes and activations as q8Weight/q8Act (same int8 values, same
// scales, same integer products), arranged so that one 512-bit lane holds
// one block of 16 from the first VPDPBUSD to the conversion to float32.
// A supergroup is 256 elements, 16 blocks; each of its 4 VPDPBUSD adds 4
// products of every block into that block's lane, so a supergroup costs one
// int32-to-float32 conversion and one fused multiply-add per row and token
// where the 128-element layout costs four (lanes 4 to a block) plus the
// permutes that spread the block scales over them: at decode 20 vector
// instructions per row and supergroup instead of 36, at prefill 7 per token
// instead of 18.
//
//   - codes: rows in quads as in q8Weight, each quad one stream of
//     supergroups (row 0's 128 bytes, row 1's, row 2's, row 3's); byte
//     64h+4l+i of a row's supergroup holds element 16l+8h+i in its low
//     nibble and 16l+8h+4+i in its high nibble (h < 2, block l < 16, i < 4);
//     negative block scales folded into the codes' signs, zero ones into
//     zero codes (q8Scale);
//   - scales: 16 bytes per row and supergroup, block l at l, as q8Scale
//     codes;
//   - activations (q16Act): per token and supergroup 256 int8 in 4 chunks
//     of 64, chunk k byte 4l+i = element 16l+4k+i (the chunk that meets the
//     low nibbles of the codes' first 64 bytes, then their high nibbles,
//     then the second 64 bytes'), 16 float32 block scales and 16 int32
//     -12 times each block's sum (the codes' +12 offset, nvfp4q8_amd64.s).
const (
	q16Group  = 256 // elements per supergroup
	q16GroupB = q16Group / 2
	q16Blocks = q16Group / quant.NVFP4BlockSize // 16
)

// q16Weight is an NVFP4 matrix repacked for the block-per-lane kernels:
// supergroups of 256, codes quads x groups x 4 rows x 128 bytes, scales
// quads x groups x 4 rows x 16 bytes.
type q16Weight struct{ quadWeight }

// newQ16Weight repacks q (see q16Weight), rows split over par.
func newQ16Weight(q *quant.NVFP4, par func(n int, fn func(lo, hi int))) *q16Weight {
	w := &q16Weight{newQuadWeight(q, q16Blocks)}
	par(q.Rows, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			w.repackRow(q, r)
		}
	})
	return w
}

// repackRow writes row r of q into w.
func (w *q16Weight) repackRow(q *quant.NVFP4, r int) {
	K, G := w.cols, w.groups
	nb := K / quant.NVFP4BlockSize
	packed := q.Packed[r*K/2 : (r+1)*K/2]
	sc := q.Scales[r*nb : (r+1)*nb]
	quad, j := r/4, r%4
	// code is element k's 4-bit code with its block's sign and zero folded in.
	code := func(k int, flip, keep byte) byte {
		if k >= K {
			return 0
		}
		return (packed[k/2]>>(4*(k&1))&0xf ^ flip) & keep
	}
	for g := range G {
		at := (quad*G+g)*4 + j
		out := w.codes[at*q16GroupB : (at+1)*q16GroupB]
		for l := range q16Blocks {
			c, flip, keep := byte(1<<3), byte(0), byte(0)
			if kb := g*q16Blocks + l; kb < nb {
				t := q8ScaleTable[sc[kb]]
				c = t.code
				if t.neg {
					flip = 8
				}
				if !t.zero {
					keep = 0xf
				}
			}
			w.scales[at*q16Blocks+l] = c
			k0 := g*q16Group + 16*l
			for h := range 2 {
				for i := range 4 {
					out[64*h+4*l+i] = code(k0+8*h+i, flip, keep) | code(k0+8*h+4+i, flip, keep)<<4
				}
			}
		}
	}
}

// q16Act is a row of activations in the block-per-lane form (see
// q16Weight): groups*256 int8, groups*16 float32 scales and groups*16 int32
// offset corrections.
type q16Act struct {
	x  []int8
	sc []float32
	c  []int32
}

// newQ16Act returns m rows of activations in one allocation each for x, sc
// and c, consecutive (the prefill kernel steps from one token to the next
// by a fixed stride).
func newQ16Act(groups, m int) []q16Act {
	n, nb := groups*q16Group, groups*q16Blocks
	x, sc, c := make([]int8, m*n), make([]float32, m*nb), make([]int32, m*nb)
	a := make([]q16Act, m)
	for i := range a {
		a[i] = q16Act{x: x[i*n : (i+1)*n], sc: sc[i*nb : (i+1)*nb], c: c[i*nb : (i+1)*nb]}
	}
	return a
}

// quantizeQ16 quantizes x (len <= groups*256) into a as quantizeQ8 does
// (q8QuantizeBlock), each block's codes spread over the 4 chunks (all 16
// written, zeros past x), the whole blocks in assembly where
// quantizeQ16Fast has it.
func quantizeQ16(a q16Act, x []float32, groups int) {
	for blk := quantizeQ16Fast(a, x, groups); blk < groups*q16Blocks; blk++ {
		var q [quant.NVFP4BlockSize]int8
		s, sum := q8QuantizeBlock(q[:], x, blk*quant.NVFP4BlockSize)
		g, l := blk/q16Blocks, blk%q16Blocks
		dst := a.x[g*q16Group+4*l:]
		for e, c := range q {
			dst[64*(e>>2)+e&3] = c
		}
		a.sc[blk], a.c[blk] = s, -12*sum
	}
}

// rowQ16Go is the portable kernel: one row's dot product with a (codes and
// scales at the row's place in its quad: supergroups 4*128 and 4*16 bytes
// apart), before the global scale.
func rowQ16Go(codes, scales []byte, a q16Act, groups int) float32 {
	var acc float32
	for g := range groups {
		c := codes[g*4*q16GroupB : g*4*q16GroupB+q16GroupB]
		x := a.x[g*q16Group : (g+1)*q16Group]
		var sums [q16Blocks]int32
		for p, b := range c {
			h, l := p/64, p%64/4
			sums[l] += e2m1x2[b&0xf]*int32(x[128*h+p%64]) + e2m1x2[b>>4]*int32(x[128*h+64+p%64])
		}
		for l, s := range sums {
			acc += float32(s) * (q8ScaleValue(scales[g*4*q16Blocks+l]) * a.sc[g*q16Blocks+l])
		}
	}
	return acc
}

// dot4Q16Go, row4Q16Go and row8Q16Go are the portable decode and prefill
// kernels (quadGo, tokensGo).
func dot4Q16Go(codes, scales []byte, a q16Act, groups int, out *[4]float32) {
	quadGo(rowQ16Go, q16GroupB, q16Blocks, codes, scales, a, groups, out)
}

func row4Q16Go(codes, scales []byte, a []q16Act, groups int, out *[4]float32) {
	tokensGo(rowQ16Go, codes, scales, a, groups, out)
}

func row8Q16Go(codes, scales []byte, a []q16Act, groups int, out *[8]float32) {
	tokensGo(rowQ16Go, codes, scales, a, groups, out)
}

// q16Kernels are the block-per-lane layout's: the tokens run over the tiles
// of quads 8 at a time (row8Q16: each supergroup of a row decoded once for
// the 8), then 4, the last m%4 one at a time.
var q16Kernels = quadKernels[q16Act]{quantize: quantizeQ16, part: partQ16, group: q16Group, partGrain: 1 << 13,
	row8: row8Q16, row4: row4Q16, dot4: dot4Q16, tile8: tile8Q16, dots: dotsQ16}

// partQ16 is supergroups [g0, g1) of a (quadKernels.part). quantQ16AVX512
// is vector code, unlike quantizeQ8's Go loops (partGrain 512): one
// token's activations up to 16k elements stay in one run, as they were
// before the first phase took them (not measured apart: no AVX-512 here).
func partQ16(a q16Act, g0, g1 int) q16Act {
	return q16Act{x: a.x[g0*q16Group : g1*q16Group], sc: a.sc[g0*q16Blocks : g1*q16Blocks], c: a.c[g0*q16Blocks : g1*q16Blocks]}
}
