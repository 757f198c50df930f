package cpu

import (
	"math"
	"sync"

	"github.com/manifoldlm/manifold/quant"
)

// The fast NVFP4 path multiplies the weights' E2M1 codes with activations
// quantized to int8, in integers, as llama.cpp's Q4_0 x Q8_0 kernels do:
//
//   - at upload the matrix is repacked (q8Weight): rows in quads, each quad
//     one contiguous stream of 128-element groups (row 0's group, row 1's,
//     row 2's, row 3's, then the next group), 64 bytes of codes per row and
//     group (byte e: element e in the low nibble, element 32+e in the high
//     nibble, for e < 32; then elements 64..127 alike), and 8 bytes of block
//     scales per row and group in the order the kernel's horizontal adds
//     leave the block sums in (blocks 0 2 4 6 1 3 5 7);
//   - each block scale is re-encoded as an unsigned 8-bit float with a 5-bit
//     exponent (q8Scale) that turns into float32 with a shift and an add: no
//     E4M3 subnormals left (they are renormalized), a negative scale folded
//     into the codes' signs, a zero scale into zero codes, all exact;
//   - per token the activations are quantized once (q8Act): int8 with one
//     float32 scale per block of 16 (amax/127, round to nearest), zero
//     padded to whole groups;
//   - the kernel computes, per block, the integer sum of 2*e2m1 * int8 and
//     adds it times (weight scale * activation scale) to a float32
//     accumulator; the row's sum times GlobalScale/2 is the result.
//
// The kernels: AVX2 and AVX-512 VNNI (nvfp4q8_amd64.s), NEON with SDOT or
// SMULL (nvfp4q8_arm64.s: a TBL decodes 16 codes, the block sums come out of
// ADDP in the same scale order), the portable Go ones below elsewhere.
//
// The float32 reference (quant.NVFP4.MatVecRows / MatMulRows) stays for
// tests and for Embed; the error of this path against it is the activation
// rounding, about 0.3% of the dot product's scale (see nvfp4q8_test.go).

const (
	q8Group     = 128 // elements per group
	q8GroupB    = q8Group / 2
	q8Blocks    = q8Group / quant.NVFP4BlockSize // 8 blocks per group
	q8ScaleBias = 117 << 23                      // q8Scale code<<20 + bias = float32 bits
)

// q8Order is the position of each block of a group in the kernel's scale
// vector (the order VPHADDD leaves the block sums in).
var q8Order = [q8Blocks]int{0, 4, 1, 5, 2, 6, 3, 7}

// q8Weight is an NVFP4 matrix repacked for the int8 kernels: groups of
// 128, codes quads x groups x 4 rows x 64 bytes, scales quads x groups x
// 4 rows x 8 bytes.
type q8Weight struct{ quadWeight }

// quadWeight is a repacked NVFP4 matrix (q8Weight, q16Weight) as
// matmulQuads reads it: codes and scales in quads of 4 rows, each quad one
// stream of groups (the 4 rows' groupB code bytes and blocks scale bytes
// in turn).
type quadWeight struct {
	rows, cols     int
	groups         int // ceil(cols/(2*groupB))
	groupB, blocks int
	codes, scales  []byte
	mul            float32 // GlobalScale/2 (the codes are 2*e2m1)
}

// newQuadWeight is q's quadWeight for groups of blocks blocks, its codes
// and scales allocated (zero).
func newQuadWeight(q *quant.NVFP4, blocks int) quadWeight {
	group := blocks * quant.NVFP4BlockSize
	G := (q.Cols + group - 1) / group
	quads := (q.Rows + 3) / 4
	return quadWeight{rows: q.Rows, cols: q.Cols, groups: G, groupB: group / 2, blocks: blocks, mul: q.GlobalScale / 2,
		codes: hugeBytes(quads * G * 4 * group / 2), scales: make([]byte, quads*G*4*blocks)}
}

// q8Scale re-encodes an E4M3 block scale code: the magnitude as
// (e<<3 | m) with value (1+m/8)*2^(e-10), e in 1..18, so that the float32
// bits are code<<20 + q8ScaleBias; neg says the scale was negative, zero
// that it was zero (the block's codes must then be negated or zeroed).
func q8Scale(c byte) (code byte, neg, zero bool) {
	v := quant.E4M3ToFloat32(c)
	if v == 0 {
		return 1 << 3, false, true
	}
	if v < 0 {
		neg, v = true, -v
	}
	bits := math.Float32bits(v)
	e := int(bits>>23) - 127 + 10
	return byte(e<<3) | byte(bits>>20&7), neg, false
}

// q8ScaleTable is q8Scale of every E4M3 code, computed once at package
// initialization and only read afterwards.
var q8ScaleTable = func() (t [256]struct {
	code      byte
	neg, zero bool
}) {
	for c := range t {
		t[c].code, t[c].neg, t[c].zero = q8Scale(byte(c))
	}
	return t
}()

// q8ScaleValue is the float32 a q8Scale code stands for.
func q8ScaleValue(code byte) float32 { return math.Float32frombits(uint32(code)<<20 + q8ScaleBias) }

// newQ8Weight repacks q (see q8Weight), rows split over par (which runs
// fn over [0, n) in parallel ranges).
func newQ8Weight(q *quant.NVFP4, par func(n int, fn func(lo, hi int))) *q8Weight {
	w := &q8Weight{newQuadWeight(q, q8Blocks)}
	G := w.groups
	par(q.Rows, func(lo, hi int) {
		row := make([]byte, G*q8GroupB) // one row's packed codes, zero padded to whole groups
		for r := lo; r < hi; r++ {
			w.repackRow(q, r, row)
		}
	})
	return w
}

// repackRow writes row r of q into w; row is scratch of groups*64 bytes.
func (w *q8Weight) repackRow(q *quant.NVFP4, r int, row []byte) {
	K, G := w.cols, w.groups
	nb := K / quant.NVFP4BlockSize
	clear(row[copy(row, q.Packed[r*K/2:(r+1)*K/2]):])
	sc := q.Scales[r*nb : (r+1)*nb]
	quad, j := r/4, r%4
	for g := range G {
		at := (quad*G+g)*4 + j
		// Per block of the group: its scale code, and masks that negate
		// (flip the sign bit of) or zero its codes.
		var flip, keep [q8Blocks]byte
		plain := true // no negative or zero scale in the group
		for b := range q8Blocks {
			code, neg, zero := byte(1<<3), false, true
			if kb := g*q8Blocks + b; kb < nb {
				t := q8ScaleTable[sc[kb]]
				code, neg, zero = t.code, t.neg, t.zero
			}
			w.scales[at*q8Blocks+q8Order[b]] = code
			if neg {
				flip[b] = 8
			}
			if !zero {
				keep[b] = 0xf
			}
			plain = plain && !neg && !zero
		}
		src := row[g*q8GroupB : (g+1)*q8GroupB]
		out := w.codes[at*q8GroupB : (at+1)*q8GroupB]
		for h := range 2 {
			// Byte e of the half: element 64h+e low, 64h+32+e high; the
			// source bytes hold elements 2i, 2i+1.
			lo, hi := src[h*32:h*32+16], src[h*32+16:h*32+32]
			o := out[h*32 : h*32+32]
			for i := range 16 {
				a, c := lo[i], hi[i]
				o[2*i] = a&0xf | c<<4
				o[2*i+1] = a>>4 | c&0xf0
			}
			for e := range 32 {
				if plain {
					break
				}
				bl, bh := 4*h+e/16, 4*h+2+e/16 // blocks of the low and high nibble
				o[e] = (o[e] ^ (flip[bl] | flip[bh]<<4)) & (keep[bl] | keep[bh]<<4)
			}
		}
	}
}

// q8Act is a row of activations quantized for the int8 kernels: groups*128
// int8 values, groups*8 float32 block scales in q8Order and, in the same
// order, 12 times each block's sum of the int8 values (the AVX2 kernel's
// codes carry an offset of +12, see nvfp4q8_amd64.s). Where the AVX-512
// VNNI kernels run, also their form of the same values (expandQ8): x5 the
// int8 values of each group permuted to [0..31, 64..95, 32..63, 96..127],
// and per group 32 int32 c5: for the blocks in the order q5Order, 4 times
// each, -3 times the block's sum (a quarter of the offset's share).
type q8Act struct {
	q   []int8
	sc  []float32
	sum []int32

	x5 []int8
	c5 []int32
}

// q5Order is the order of the blocks in q8Act's c5.
var q5Order = [q8Blocks]int{0, 1, 4, 5, 2, 3, 6, 7}

// expandQ8 writes a's VNNI form from its q, sc and sum.
func expandQ8(a q8Act, groups int) {
	for g := range groups {
		q, x5 := a.q[g*q8Group:(g+1)*q8Group], a.x5[g*q8Group:(g+1)*q8Group]
		copy(x5[0:32], q[0:32])
		copy(x5[32:64], q[64:96])
		copy(x5[64:96], q[32:64])
		copy(x5[96:128], q[96:128])
		for i, b := range q5Order {
			at := g*q8Blocks + q8Order[b]
			for l := range 4 {
				a.c5[g*32+4*i+l] = -a.sum[at] / 4
			}
		}
	}
}

// q8QuantizeBlock quantizes the block of 16 at lo of x (fewer at its end,
// none past it) into q: scale s = amax/127, each value rounded to the
// nearest integer (halves away from zero); sum is the sum of the codes.
// Nothing is written, s and sum are 0, for a block of zeros.
func q8QuantizeBlock(q []int8, x []float32, lo int) (s float32, sum int32) {
	if lo >= len(x) {
		return 0, 0
	}
	v := x[lo:min(len(x), lo+quant.NVFP4BlockSize)]
	var amax uint32 // bits of |v|: they order like the values
	for _, f := range v {
		amax = max(amax, math.Float32bits(f)&0x7fffffff)
	}
	s = math.Float32frombits(amax) / 127
	if s == 0 {
		return 0, 0
	}
	inv := 1 / s
	q = q[:len(v)]
	for i, f := range v {
		// r rounded here, never fused with the add below (quantQ16AVX512
		// rounds it too).
		r := float32(f * inv)
		h := math.Float32frombits(math.Float32bits(r)&0x80000000 | 0x3f000000) // ±0.5
		c := int32(r + h)
		q[i] = int8(c)
		sum += c
	}
	return s, sum
}

// quantizeQ8 quantizes x (len <= groups*128) into a (sized for groups):
// per block of 16, scale amax/127 and each value rounded to the nearest
// integer (halves away from zero).
func quantizeQ8(a q8Act, x []float32, groups int) {
	clear(a.q)
	for g := range groups {
		for b := range q8Blocks {
			lo := g*q8Group + b*quant.NVFP4BlockSize
			at := g*q8Blocks + q8Order[b]
			s, sum := q8QuantizeBlock(a.q[lo:], x, lo)
			a.sc[at], a.sum[at] = s, 12*sum
		}
	}
	if a.x5 != nil {
		expandQ8(a, groups)
	}
}

func newQ8Act(groups, m int) []q8Act {
	q := make([]int8, m*groups*q8Group)
	sc := make([]float32, m*groups*q8Blocks)
	sum := make([]int32, m*groups*q8Blocks)
	a := make([]q8Act, m)
	for i := range a {
		lo, hi := i*groups*q8Blocks, (i+1)*groups*q8Blocks
		a[i] = q8Act{q: q[i*groups*q8Group : (i+1)*groups*q8Group], sc: sc[lo:hi], sum: sum[lo:hi]}
	}
	if hasVNNI512 {
		n := groups * q8Group
		x5, c5 := make([]int8, m*n), make([]int32, m*n/4)
		for i := range a {
			a[i].x5, a[i].c5 = x5[i*n:(i+1)*n], c5[i*n/4:(i+1)*n/4]
		}
	}
	return a
}

// e2m1x2 is 2*e2m1 of each 4-bit code.
var e2m1x2 = [16]int32{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// quadGo is the portable decode kernel made of the one-row kernel row of a
// layout (groupB code bytes and blocks scale bytes a row's group): the
// dot products of the quad's 4 rows (codes and scales starting at the quad)
// with a, before the global scale.
func quadGo[A any](row func(codes, scales []byte, a A, groups int) float32, groupB, blocks int, codes, scales []byte, a A, groups int, out *[4]float32) {
	for j := range 4 {
		out[j] = row(codes[j*groupB:], scales[j*blocks:], a, groups)
	}
}

// tokensGo is the portable prefill kernel made of row: one row (codes and
// scales at its place in its quad) with the len(out) tokens of a.
func tokensGo[A any, O [4]float32 | [8]float32](row func(codes, scales []byte, a A, groups int) float32, codes, scales []byte, a []A, groups int, out *O) {
	for t := range len(*out) {
		(*out)[t] = row(codes, scales, a[t], groups)
	}
}

// consecutive is first[:k*n], the activations of k tokens n elements each
// from first (the first token's) to last (the k-th's), checked to be one
// allocation (newQ8Act, newQ16Act): the prefill kernels step from one
// token to the next by n elements.
func consecutive[T any](first, last []T, k, n int) []T {
	s := first[:k*n]
	if &s[(k-1)*n] != &last[0] {
		panic("cpu: a prefill kernel's activations are not consecutive")
	}
	return s
}

// dot4Q8Go and row4Q8Go are the portable dot4Q8 and row4Q8.
func dot4Q8Go(codes, scales []byte, a q8Act, groups int, out *[4]float32) {
	quadGo(rowQ8Go, q8GroupB, q8Blocks, codes, scales, a, groups, out)
}

func row4Q8Go(codes, scales []byte, a []q8Act, groups int, out *[4]float32) {
	tokensGo(rowQ8Go, codes, scales, a, groups, out)
}

// rowQ8Go is one row's dot product with a, before the global scale; the
// row's groups are 4*64 bytes of codes and 4*8 of scales apart.
func rowQ8Go(codes, scales []byte, a q8Act, groups int) float32 {
	var acc float32
	for g := range groups {
		c := codes[g*4*q8GroupB : g*4*q8GroupB+q8GroupB]
		x := a.q[g*q8Group : (g+1)*q8Group]
		var sums [q8Blocks]int32
		for h := range 2 {
			for e := range 32 {
				lo, hi := h*64+e, h*64+32+e
				sums[lo/16] += e2m1x2[c[h*32+e]&0xf] * int32(x[lo])
				sums[hi/16] += e2m1x2[c[h*32+e]>>4] * int32(x[hi])
			}
		}
		for b := range q8Blocks {
			p := q8Order[b]
			acc += float32(sums[b]) * (q8ScaleValue(scales[g*4*q8Blocks+p]) * a.sc[g*q8Blocks+p])
		}
	}
	return acc
}

// quadTile is the number of quads of weight rows (32 rows, 16*K bytes of
// codes) that matmulQuads keeps in cache while the tokens run over them.
const quadTile = 8

// quadKernel is a prefill kernel: one row (codes and scales at its place in
// its quad) with len(out) consecutive tokens a.
type quadKernel[A any, O [4]float32 | [8]float32] func(codes, scales []byte, a []A, groups int, out *O)

// quadKernels are the kernels of a repacked layout whose activations are A.
type quadKernels[A any] struct {
	quantize func(a A, x []float32, groups int)
	// part is groups [g0, g1) of a, each group elements of x: quantize
	// writes them alone (the groups are independent), so that one token's
	// quantization splits over threads in runs of partGrain elements.
	part      func(a A, g0, g1 int) A
	group     int
	partGrain int

	row8 quadKernel[A, [8]float32] // nil where the layout has none
	row4 quadKernel[A, [4]float32]
	dot4 func(codes, scales []byte, a A, groups int, out *[4]float32) // decode: a quad's 4 rows with one token

	// tile8 and dots, where not nil, are prefillQuads with row8 (8 tokens)
	// and decodeQuads with dot4 (one token, whole quads) in one call for
	// all the rows, the outputs scaled and stored by the kernel; they
	// return false, having done nothing, where the processor lacks their
	// kernel. The per-row calls of row8 through a func value cost about a
	// tenth of the prefill's time (DECISIONS.md).
	tile8 func(out []float32, acts []A, w *quadWeight, q0, q1 int) bool
	dots  func(out []float32, a A, w *quadWeight, q0, q1 int) bool
}

// matmulRepacked is MatMul for an NVFP4 weight w repacked as q, with k its
// layout's kernels: the m rows of x are quantized into acts (in parallel
// over rows), then the threads take chunks of the quads of weight rows in
// turn (parallelDynamic).
func matmulRepacked[A any](b *Backend, out, x []float32, w *Weight, m int, q *quadWeight, acts []A, k *quadKernels[A]) {
	K, N := w.cols, w.rows
	// The activations are quantized in the fan-out's first phase: a token a
	// run, or one token's groups in runs of k.partGrain elements. A decode
	// step's were serial: on AVX2 (quantizeQ8 in Go, about 4 ns an element)
	// 2048 took 8 µs, six times a layer, before each of its fan-outs.
	quantize := phase{m, (m + b.threads - 1) / b.threads, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			k.quantize(acts[i], x[i*K:(i+1)*K], q.groups)
		}
	}}
	if m == 1 && q.groups*k.group >= 2*k.partGrain {
		quantize = phase{q.groups, max(1, k.partGrain/k.group), func(g0, g1 int) {
			k.quantize(k.part(acts[0], g0, g1), x[min(K, g0*k.group):min(K, g1*k.group)], g1-g0)
		}}
	}
	quads := (N + 3) / 4
	grain := max(1, (1<<14)/(K*max(m, 1))) // at least ~64k products per goroutine
	align := 1
	if m >= 4 {
		align = quadTile // whole tiles: each is read once for all the tokens
	}
	b.parallelDynamicAfter(quantize, quads, dynamicChunk(quads, b.threads, grain, align), func(lo, hi int) {
		matmulQuads(out, acts, q, lo, hi, k)
		w.addBias(out, m, lo*4, min(hi*4, N))
	})
}

// matmulQuads computes out[i*N + r] for the m rows of acts and rows r in
// quads [qlo, qhi) of w. Tiles of quads are kept in cache while the tokens
// run over them 8 at a time (tile8 or row8, each weight group decoded once
// for the 8), then 4 (row4), the last m%4 one at a time (dots or dot4);
// with fewer than 4 tokens there is no tile to keep, and each token runs
// over all the quads at once.
func matmulQuads[A any](out []float32, acts []A, w *quadWeight, qlo, qhi int, k *quadKernels[A]) {
	N := w.rows
	m8, m4 := 0, len(acts)&^3
	if k.row8 != nil {
		m8 = len(acts) &^ 7
	}
	// The per-row kernels' outputs (before the global scale): called
	// through func values, they are on the heap, taken from quadOuts (a
	// decode step ran 3264 allocations of them and their closure at 2
	// threads, TestDecodeFanOuts).
	o8 := quadOuts.Get().(*[8]float32)
	defer quadOuts.Put(o8)
	outs := func() *[8]float32 { return o8 }
	tile := quadTile
	if m4 == 0 {
		tile = qhi - qlo
	}
	for t0 := qlo; t0 < qhi; t0 += tile {
		t1 := min(t0+tile, qhi)
		for i := 0; i < m8; i += 8 {
			if k.tile8 == nil || !k.tile8(out[i*N:], acts[i:i+8], w, t0, t1) {
				prefillQuads(out[i*N:], acts[i:i+8], w, t0, t1, k.row8, outs())
			}
		}
		if m4 > m8 {
			prefillQuads(out[m8*N:], acts[m8:m4], w, t0, t1, k.row4, (*[4]float32)(outs()[:4]))
		}
		for i := m4; i < len(acts); i++ {
			// dots takes whole quads: a last quad past N goes to dot4.
			full := min(t1, N/4)
			if k.dots == nil || !k.dots(out[i*N:], acts[i], w, t0, full) {
				full = t0
			}
			if full < t1 {
				decodeQuads(out[i*N:], acts[i:i+1], w, full, t1, k.dot4, (*[4]float32)(outs()[:4]))
			}
		}
	}
}

// quadOuts holds matmulQuads' kernel outputs between calls.
var quadOuts = sync.Pool{New: func() any { return new([8]float32) }}

// prefillQuads is matmulQuads for the tokens acts, len(acts) a multiple of
// len(*o), the kernel's outputs, and the quads [t0, t1).
func prefillQuads[A any, O [4]float32 | [8]float32](out []float32, acts []A, w *quadWeight, t0, t1 int, row quadKernel[A, O], o *O) {
	G, N := w.groups, w.rows
	qstrideC, qstrideS := G*4*w.groupB, G*4*w.blocks
	n := len(*o)
	for i := 0; i < len(acts); i += n {
		for quad := t0; quad < t1; quad++ {
			for j := range min(4, N-quad*4) {
				row(w.codes[quad*qstrideC+j*w.groupB:(quad+1)*qstrideC], w.scales[quad*qstrideS+j*w.blocks:(quad+1)*qstrideS], acts[i:i+n], G, o)
				r := quad*4 + j
				for t := range n {
					out[(i+t)*N+r] = (*o)[t] * w.mul
				}
			}
		}
	}
}

// decodeQuads is matmulQuads for the tokens acts one at a time and the
// quads [t0, t1), o the kernel's outputs.
func decodeQuads[A any](out []float32, acts []A, w *quadWeight, t0, t1 int, dot4 func(codes, scales []byte, a A, groups int, out *[4]float32), o *[4]float32) {
	G, N := w.groups, w.rows
	qstrideC, qstrideS := G*4*w.groupB, G*4*w.blocks
	for i := range acts {
		row := out[i*N : (i+1)*N]
		for quad := t0; quad < t1; quad++ {
			dot4(w.codes[quad*qstrideC:(quad+1)*qstrideC], w.scales[quad*qstrideS:(quad+1)*qstrideS], acts[i], G, o)
			r := quad * 4
			for j := range min(4, N-r) {
				row[r+j] = o[j] * w.mul
			}
		}
	}
}

// q8Kernels are the 128-element layout's: row4Q8 for 4 tokens, dot4Q8 for
// one.
var q8Kernels = quadKernels[q8Act]{quantize: quantizeQ8, part: partQ8, group: q8Group, partGrain: 512, row4: row4Q8, dot4: dot4Q8}

// partQ8 is groups [g0, g1) of a (quadKernels.part).
func partQ8(a q8Act, g0, g1 int) q8Act {
	p := q8Act{q: a.q[g0*q8Group : g1*q8Group], sc: a.sc[g0*q8Blocks : g1*q8Blocks], sum: a.sum[g0*q8Blocks : g1*q8Blocks]}
	if a.x5 != nil {
		p.x5, p.c5 = a.x5[g0*q8Group:g1*q8Group], a.c5[g0*32:g1*32]
	}
	return p
}
