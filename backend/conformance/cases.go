package conformance

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/layers/mhc"
	"github.com/manifoldlm/manifold/quant"
)

// nvfp4Q8Tol bounds NVFP4 matmuls whose x is rounded to int8 per block of
// 16 (the CPU's default kernels, as llama.cpp's Q8 activations): about
// 0.5% of the output's scale at most over these shapes.
const nvfp4Q8Tol = 1e-2

// Cases is the table: every op the models use, at shapes that cover each
// kernel choice of the CUDA backend (m = 1 decode and m > 1 prefill; widths
// with and without the bulk-copy kernel's partial last stage, K % 2048 != 0;
// sizes off every tile).
func Cases() []Case {
	var cs []Case
	// MatMul in every weight format. m = 1 takes the decode kernels, m up
	// to 16 the small-m ones, larger m the GEMM; K = 2048 and 4096 take the
	// bulk-copy m = 1 kernel on the GPU, and K = 2560 and 1536 the same with
	// a partial last stage of 512 and 1536 elements.
	for _, f := range []backend.Format{backend.F32, backend.BF16, backend.F16, backend.NVFP4} {
		for _, s := range [][3]int{{1, 7, 48}, {1, 257, 2048}, {1, 96, 4096}, {1, 45, 2560}, {1, 130, 1536}, {3, 33, 80}, {16, 130, 512},
			{17, 64, 96}, {70, 200, 272}} {
			m, rows, cols := s[0], s[1], s[2]
			tol, q8 := 2e-5, 0.0
			switch f {
			case backend.F16, backend.BF16:
				tol = 4e-3 // the GPU's tensor cores take x in 16 bits
			case backend.NVFP4:
				tol, q8 = 4e-3, nvfp4Q8Tol
			}
			cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("%s/m=%d/%dx%d", f, m, rows, cols), Tol: tol, Q8Tol: q8,
				Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
					return matmul(b, rng, f, m, rows, cols, false)
				}})
		}
	}
	// The block-scaled formats DeepSeek ships (FP8 with 128x128 tile scales
	// in E8M0 or f32; MXFP4), at sizes off the tiles; MXFP4 needs K % 32.
	for _, f := range []backend.Format{backend.FP8Block, backend.MXFP4} {
		for _, s := range [][3]int{{1, 7, 64}, {1, 257, 2048}, {3, 130, 320}, {17, 64, 96}, {70, 200, 4096}} {
			m, rows, cols := s[0], s[1], s[2]
			cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("%s/m=%d/%dx%d", f, m, rows, cols), Tol: 4e-3, Needs: "format:" + f.String(),
				Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
					return matmul(b, rng, f, m, rows, cols, false)
				}})
		}
	}
	cs = append(cs, Case{Op: "MatMul", Shape: "fp8block-f32scale+bias/m=2/130x200", Tol: 4e-3, Needs: "format:fp8block",
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			return matmul(b, rng, fp8BlockF32, 2, 130, 200, true)
		}})
	// Widths off every unroll of K (8 and 16), for the formats that allow
	// them: the CPU's 4x3 prefill tiles and 4-row matvec leave tails.
	for _, f := range []backend.Format{backend.F32, backend.BF16} {
		tol := 2e-5
		if f == backend.BF16 {
			tol = 4e-3
		}
		for _, m := range []int{1, 9} {
			cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("%s/m=%d/13x203", f, m), Tol: tol,
				Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
					return matmul(b, rng, f, m, 13, 203, false)
				}})
		}
	}
	// The bf16 GEMM (m >= 5 on the GPU) at token counts on and off its
	// tiles (16 to 128 tokens), features and K off every tile and stage,
	// a prefill chunk of 512 tokens, and a bias. It takes x as two 16-bit
	// halves (kernels/bf16.cuh), so it is held to float32's tolerance, not
	// the 16-bit activations' 4e-3. 13x604x2600 takes the CPU's AVX-512
	// bf16 GEMM (4x6 tiles) over several row panels and k passes, each
	// ragged at its end, and a K tail.
	for _, s := range [][3]int{{5, 130, 200}, {16, 77, 4104}, {100, 257, 328}, {512, 200, 264}, {13, 604, 2600}} {
		m, rows, cols := s[0], s[1], s[2]
		cs = append(cs, Case{Op: "MatMul", Shape: fmt.Sprintf("bf16+bias/m=%d/%dx%d", m, rows, cols), Tol: 1e-4,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return matmul(b, rng, backend.BF16, m, rows, cols, true)
			}})
	}
	cs = append(cs, Case{Op: "MatMul", Shape: "f32+bias/m=5/9x40", Tol: 2e-5,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			return matmul(b, rng, backend.F32, 5, 9, 40, true)
		}})
	for _, s := range [][2]int{{1, 64}, {5, 4096}, {3, 100}, {33, 7}} {
		rows, w := s[0], s[1]
		cs = append(cs, Case{Op: "RMSNorm", Shape: fmt.Sprintf("%dx%d", rows, w), Tol: 1e-5,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				x, g := rnd(rng, rows*w, 1), rnd(rng, w, 0.2)
				for i := range g {
					g[i]++
				}
				want := make([]float32, len(x))
				for r := range rows {
					layers.RMSNorm(want[r*w:(r+1)*w], x[r*w:(r+1)*w], g, 1e-6)
				}
				dst := b.NewBuffer(len(x))
				b.RMSNorm(dst, upload(b, x), upload(b, g), 1e-6)
				return read(b, dst), want
			}})
	}
	for _, s := range []struct {
		rows, heads, hd, off, pos0 int
		inter, inverse             bool
	}{{1, 4, 64, 0, 37, false, false}, {7, 3, 128, 0, 0, false, false}, {3, 2, 64, 32, 1000, true, false}, {2, 5, 64, 0, 30000, false, true}} {
		cs = append(cs, Case{Op: "RoPE", Shape: fmt.Sprintf("%dx%dx%d/off=%d/pos=%d/inter=%v/inv=%v", s.rows, s.heads, s.hd, s.off, s.pos0, s.inter, s.inverse), Tol: 2e-5,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				r := must(layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: float64(s.hd-s.off) / float64(s.hd)}, s.hd))
				r.Interleaved = s.inter
				stride := s.heads * s.hd
				x := rnd(rng, s.rows*stride, 1)
				want := append([]float32(nil), x...)
				layers.ApplyRoPE(want, s.rows, s.heads, s.hd, s.off, s.pos0, r, s.inverse)
				xb := upload(b, x)
				b.RoPE(xb, s.rows, s.heads, s.hd, s.off, s.pos0, r, s.inverse)
				return read(b, xb), want
			}})
	}
	for _, n := range []int{1, 100, 4099} {
		for _, limit := range []float32{0, 7} {
			cs = append(cs, Case{Op: "SwiGLU", Shape: fmt.Sprintf("n=%d/limit=%g", n, limit), Tol: 1e-6,
				Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
					g, u := rnd(rng, n, 4), rnd(rng, n, 4)
					want := make([]float32, n)
					layers.SwiGLU(want, g, u, limit)
					dst := b.NewBuffer(n)
					b.SwiGLU(dst, upload(b, g), upload(b, u), limit)
					return read(b, dst), want
				}})
		}
		cs = append(cs, Case{Op: "Add,Scale,Copy", Shape: fmt.Sprintf("n=%d", n), Tol: 0,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				x, y := rnd(rng, n, 1), rnd(rng, n, 1)
				want := make([]float32, 3*n)
				for i := range n {
					want[i], want[n+i], want[2*n+i] = x[i]+y[i], x[i]*0.37, y[i]
				}
				out := b.NewBuffer(3 * n)
				b.Add(b.View(out, 0, n), upload(b, x), upload(b, y))
				b.Scale(b.View(out, n, n), upload(b, x), 0.37)
				b.Copy(b.View(out, 2*n, n), upload(b, y))
				return read(b, out), want
			}})
	}
	for _, f := range []backend.Format{backend.F32, backend.BF16} {
		cs = append(cs, Case{Op: "Embed", Shape: fmt.Sprintf("%s/5of37x72", f), Tol: 0,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				const V, C = 37, 72
				table, hw := weight(rng, f, V, C)
				w := must(b.Upload(hw))
				ids := []int32{0, 36, 5, 5, 17}
				want := make([]float32, 0, len(ids)*C)
				for _, id := range ids {
					want = append(want, table[int(id)*C:(int(id)+1)*C]...)
				}
				dst := b.NewBuffer(len(ids) * C)
				b.Embed(dst, w, ids)
				return read(b, dst), want
			}})
	}
	// Attention: decode (m = 1) at short and long contexts, prefill, GQA
	// groups of 1, 3, 4 and 8, a sliding window, head dims 64 and 128, and
	// 48 and 40 (off and on the CPU's 16-float GQA kernels).
	for _, s := range []struct{ heads, kv, hd, pos0, m, window int }{
		{8, 2, 64, 37, 1, 0}, {32, 8, 128, 700, 1, 0}, {4, 4, 64, 0, 19, 0}, {8, 1, 64, 5, 40, 0}, {8, 2, 64, 30, 6, 16}, {16, 2, 128, 2100, 1, 0},
		{12, 3, 48, 13, 5, 0}, {8, 2, 40, 21, 2, 7}, {6, 2, 64, 11, 3, 0},
	} {
		cs = append(cs, Case{Op: "Attention", Shape: fmt.Sprintf("h=%d/kv=%d/d=%d/pos=%d/m=%d/win=%d", s.heads, s.kv, s.hd, s.pos0, s.m, s.window), Tol: 2e-5,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				as := layers.AttentionShape{Heads: s.heads, KVHeads: s.kv, HeadDim: s.hd, Scale: float32(1 / math.Sqrt(float64(s.hd))), Window: s.window}
				return attention(b, rng, as, s.pos0, s.m)
			}})
	}
	for _, s := range [][3]int{{3, 10, 64}, {40, 100, 7}} {
		rows, src, w := s[0], s[1], s[2]
		cs = append(cs, Case{Op: "GatherRows,ScatterAddRows", Shape: fmt.Sprintf("%dof%dx%d", rows, src, w), Tol: 1e-6,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				x, acc := rnd(rng, src*w, 1), rnd(rng, src*w, 1)
				idx, scale := make([]int32, rows), rnd(rng, rows, 1)
				for i := range idx {
					idx[i] = int32(rng.IntN(src))
				}
				g := make([]float32, rows*w)
				dsv4.Gather(g, x, idx, w)
				sum := append([]float32(nil), acc...)
				dsv4.ScatterAdd(sum, g, idx, scale, w)
				gb, ab := b.NewBuffer(rows*w), upload(b, acc)
				b.GatherRows(gb, upload(b, x), idx, w)
				b.ScatterAddRows(ab, gb, idx, scale, w)
				return append(read(b, gb), read(b, ab)...), append(g, sum...)
			}})
	}
	cs = append(cs, sparseCases()...)
	cs = append(cs, hyperCases()...)
	cs = append(cs, moreHyperCases()...)
	cs = append(cs, compressedCases()...)
	cs = append(cs, pagedCases()...)
	cs = append(cs, fp8Cases()...)
	cs = append(cs, batchedCases()...)
	cs = append(cs, sampleCases()...)
	cs = append(cs, moeCases()...)
	cs = append(cs, mlaCases()...)
	cs = append(cs, mhcCases()...)
	cs = append(cs, bf16JoinCases()...)
	cs = append(cs, dsaCases()...)
	cs = append(cs, v4AttentionCases()...)
	cs = append(cs, htreeCases()...)
	cs = append(cs, embedCases()...)
	cs = append(cs, coverageCases()...)
	return cs
}

// fp8BlockF32 asks weight for FP8Block with float32 tile scales (the
// default is E8M0), as DeepSeek-V3 and V4's -Base checkpoints store them.
const fp8BlockF32 = backend.Format(255)

// weight makes a random rows x cols weight of format f and returns the
// values it holds (after rounding to f) with its host description.
func weight(rng *rand.Rand, f backend.Format, rows, cols int) ([]float32, *backend.HostWeight) {
	v := rnd(rng, rows*cols, 1/math.Sqrt(float64(cols)))
	hw := &backend.HostWeight{Name: "w", Rows: rows, Cols: cols, Format: f}
	switch f {
	case backend.FP8Block, fp8BlockF32:
		sd := quant.ScaleE8M0
		if f == fp8BlockF32 {
			sd, hw.Format = quant.ScaleF32, backend.FP8Block
		}
		hw.FP8 = must(quant.QuantizeFP8Block(v, rows, cols, 128, 128, sd))
		v = hw.FP8.Dequantize()
	case backend.MXFP4:
		hw.MX = must(quant.QuantizeMXFP4(v, rows, cols))
		v = hw.MX.Dequantize()
	case backend.F32:
		hw.Data = f32Data(v)
	case backend.BF16:
		hw.Data = make([]byte, 2*len(v))
		quant.EncodeBF16(hw.Data, v)
		quant.DecodeBF16(v, hw.Data)
	case backend.F16:
		hw.Data = make([]byte, 2*len(v))
		quant.EncodeF16(hw.Data, v)
		quant.DecodeF16(v, hw.Data)
	case backend.NVFP4:
		hw.Q = must(quant.QuantizeNVFP4(v, rows, cols))
		v = hw.Q.Dequantize()
	}
	return v, hw
}

// f32Data is v as an F32 weight's Data: little-endian float32 bits.
func f32Data(v []float32) []byte {
	d := make([]byte, 0, 4*len(v))
	for _, x := range v {
		d = binary.LittleEndian.AppendUint32(d, math.Float32bits(x))
	}
	return d
}

func matmul(b backend.Backend, rng *rand.Rand, f backend.Format, m, rows, cols int, bias bool) ([]float32, []float32) {
	wv, hw := weight(rng, f, rows, cols)
	if bias {
		hw.Bias = rnd(rng, rows, 1)
	}
	w := must(b.Upload(hw))
	x := rnd(rng, m*cols, 1)
	want := make([]float32, m*rows)
	refMatMul(want, x, wv, hw.Bias, m, rows, cols, cols, rows)
	dst := b.NewBuffer(m * rows)
	b.MatMul(dst, upload(b, x), w, m)
	return read(b, dst), want
}

// refMatMul sets out[i*outStride+r] = Σ_k x[i*xStride+k]·w[r*cols+k] (+
// bias[r]) for m rows, summed in float64.
func refMatMul(out, x, w, bias []float32, m, rows, cols, xStride, outStride int) {
	for i := range m {
		for r := range rows {
			var s float64
			for k := range cols {
				s += float64(x[i*xStride+k]) * float64(w[r*cols+k])
			}
			if bias != nil {
				s += float64(bias[r])
			}
			out[i*outStride+r] = float32(s)
		}
	}
}

// attention fills a cache with pos0 positions, then runs m queries.
func attention(b backend.Backend, rng *rand.Rand, s layers.AttentionShape, pos0, m int) ([]float32, []float32) {
	n := pos0 + m
	row := s.KVHeads * s.HeadDim
	keys, values := rnd(rng, n*row, 1), rnd(rng, n*row, 1)
	q := rnd(rng, m*s.Heads*s.HeadDim, 1)
	want := make([]float32, len(q))
	layers.Attention(want, q, keys, values, m, pos0, s)
	cache := must(b.NewKVCache(backend.KVShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: n}))
	out := b.NewBuffer(len(q))
	if pos0 > 0 { // the context, appended as a prefill whose output is dropped
		pq := b.NewBuffer(pos0 * s.Heads * s.HeadDim)
		b.Attention(b.NewBuffer(pq.Len()), pq, upload(b, keys[:pos0*row]), upload(b, values[:pos0*row]), cache, 0, 0, pos0, s)
	}
	b.Attention(out, upload(b, q), upload(b, keys[pos0*row:]), upload(b, values[pos0*row:]), cache, 0, pos0, m, s)
	return read(b, out), want
}

func sparseCases() []Case {
	var cs []Case
	for _, s := range [][2]int{{1, 128}, {9, 100}} {
		rows, w := s[0], s[1]
		cs = append(cs, Case{Op: "SparseMLAOps.LayerNorm", Shape: fmt.Sprintf("%dx%d", rows, w), Tol: 1e-5, Needs: "SparseMLAOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				x, g, bias := rnd(rng, rows*w, 2), rnd(rng, w, 1), rnd(rng, w, 1)
				want := make([]float32, len(x))
				for r := range rows {
					layers.LayerNorm(want[r*w:(r+1)*w], x[r*w:(r+1)*w], g, bias, 1e-6)
				}
				dst := b.NewBuffer(len(x))
				caps.SparseMLA.LayerNorm(dst, upload(b, x), upload(b, g), upload(b, bias), 1e-6)
				return read(b, dst), want
			}})
	}
	for _, s := range [][3]int{{2, 3, 5}, {5, 17, 8}} {
		a, bb, w := s[0], s[1], s[2]
		cs = append(cs, Case{Op: "CompressedAttentionOps.Transpose", Shape: fmt.Sprintf("%dx%dx%d", a, bb, w), Tol: 0, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				x := rnd(rng, a*bb*w, 1)
				want := make([]float32, len(x))
				dsv4.Transpose(want, x, a, bb, w)
				dst := b.NewBuffer(len(x))
				caps.Compressed.Transpose(dst, upload(b, x), a, bb, w)
				return read(b, dst), want
			}})
	}
	// The grouped output projection: one row takes the strided matmuls the
	// GPU joins three a launch (K = 2048: its bulk-copy kernel), more rows
	// the transposes.
	for _, s := range []struct {
		f                backend.Format
		m, g, rows, cols int
	}{{backend.NVFP4, 1, 4, 48, 2048}, {backend.NVFP4, 1, 3, 16, 4096}, {backend.NVFP4, 5, 3, 33, 256}, {backend.BF16, 2, 2, 7, 40}} {
		cs = append(cs, Case{Op: "CompressedAttentionOps.GroupedMatMul", Shape: fmt.Sprintf("%s/m=%d/g=%d/%dx%d", s.f, s.m, s.g, s.rows, s.cols),
			Tol: 4e-3, Q8Tol: nvfp4Q8Tol, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return groupedMatMul(b, caps, rng, s.f, s.m, s.g, s.rows, s.cols)
			}})
	}
	return cs
}

// groupedMatMul runs GroupedMatMul over g random weights against the
// float64 sums of each group's rows.
func groupedMatMul(b backend.Backend, caps backend.Capabilities, rng *rand.Rand, f backend.Format, m, g, rows, cols int) ([]float32, []float32) {
	ws, vals := make([]backend.Weight, g), make([][]float32, g)
	for j := range g {
		var hw *backend.HostWeight
		vals[j], hw = weight(rng, f, rows, cols)
		w := must(b.Upload(hw))
		ws[j] = w
	}
	x := rnd(rng, m*g*cols, 1)
	want := make([]float32, m*g*rows)
	for j := range g { // group j of row i: x[i*g*cols + j*cols:], want[i*g*rows + j*rows:]
		refMatMul(want[j*rows:], x[j*cols:], vals[j], nil, m, rows, cols, g*cols, g*rows)
	}
	dst := b.NewBuffer(len(want))
	caps.Compressed.GroupedMatMul(dst, upload(b, x), ws, m)
	return read(b, dst), want
}

func hyperCases() []Case {
	var cs []Case
	for _, s := range [][3]int{{1, 4, 256}, {7, 4, 100}, {3, 2, 4096}} {
		rows, n, hidden := s[0], s[1], s[2]
		shape := fmt.Sprintf("rows=%d/n=%d/C=%d", rows, n, hidden)
		cs = append(cs, mhcPrePostCase(rows, n, hidden))
		cs = append(cs, Case{Op: "HyperConnectionOps.MHCHeadActivate", Shape: shape, Tol: 1e-6, Needs: "HyperConnectionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				pre, base := rnd(rng, rows*n, 2), rnd(rng, n, 1)
				want := append([]float32(nil), pre...)
				mhc.HeadActivate(want, base, 0.7, 1e-6, rows, n)
				pb := upload(b, pre)
				caps.HyperConnection.MHCHeadActivate(pb, upload(b, base), 0.7, 1e-6, rows, n)
				return read(b, pb), want
			}})
	}
	return cs
}

func moreHyperCases() []Case {
	var cs []Case
	for _, s := range [][3]int{{1, 4, 256}, {6, 4, 96}} {
		rows, n, hidden := s[0], s[1], s[2]
		shape := fmt.Sprintf("rows=%d/n=%d/C=%d", rows, n, hidden)
		cs = append(cs, Case{Op: "HyperConnectionOps.MHCProject,MHCActivate", Shape: shape, Tol: 2e-5, Needs: "HyperConnectionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				mx := mhcMixer(n, hidden, mhc.Sinkhorn)
				mix, width := mx.Config().MixDim(), n*hidden
				x, fn := rnd(rng, rows*width, 1), rnd(rng, mix*width, 1/math.Sqrt(float64(width)))
				base := rnd(rng, mix, 0.5)
				hw := &backend.HostWeight{Name: "w", Rows: mix, Cols: width, Format: backend.F32, Data: f32Data(fn)}
				return mhcProjectActivate(b, caps.HyperConnection, mx, rows, x, fn, hw, base)
			}})
	}
	return cs
}

func compressedCases() []Case {
	var cs []Case
	rope := must(layers.NewRoPE(layers.RoPEParams{Theta: 160000, PartialRotaryFactor: 0.25}, 64))
	for _, s := range []struct {
		entries, rate, width int
		overlap, prev        bool
	}{{3, 16, 64, false, false}, {5, 4, 64, true, true}, {1, 4, 64, true, false}} {
		cs = append(cs, Case{Op: "CompressedAttentionOps.CompressKV", Shape: fmt.Sprintf("entries=%d/rate=%d/overlap=%v/prev=%v", s.entries, s.rate, s.overlap, s.prev), Tol: 2e-5, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				a := dsv4.CompressArgs{Entries: s.entries, Rate: s.rate, Width: s.width, Overlap: s.overlap, Prev: s.prev, Pos0: 64, Eps: 1e-6, RoPE: rope}
				rw, src := a.RowWidth(), a.SourceRows()
				kv, gate, ape, norm := rnd(rng, src*rw, 1), rnd(rng, src*rw, 1), rnd(rng, s.rate*rw, 0.5), rnd(rng, s.width, 0.2)
				want := make([]float32, s.entries*s.width)
				dsv4.Compress(want, kv, gate, ape, norm, a)
				dst := b.NewBuffer(len(want))
				caps.Compressed.CompressKV(dst, upload(b, kv), upload(b, gate), upload(b, ape), upload(b, norm), a)
				return read(b, dst), want
			}})
	}
	for _, s := range []struct{ m, heads, entries, topK, pos0 int }{{1, 8, 40, 16, 163}, {5, 4, 9, 4, 36}, {3, 8, 300, 64, 1200}} {
		cs = append(cs, Case{Op: "CompressedAttentionOps.CompressedIndexTopK", Shape: fmt.Sprintf("m=%d/h=%d/entries=%d/k=%d", s.m, s.heads, s.entries, s.topK), Tol: 0, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				const dim = 32
				a := dsv4.IndexArgs{M: s.m, Heads: s.heads, Dim: dim, Entries: s.entries, TopK: s.topK, Pos0: s.pos0, Rate: 4, Scale: float32(1 / math.Sqrt(dim))}
				q, keys, w := rnd(rng, s.m*s.heads*dim, 1), rnd(rng, s.entries*dim, 1), rnd(rng, s.m*s.heads, 1)
				want := make([]float32, s.m*s.topK)
				dsv4.IndexTopK(want, q, keys, w, make([]float32, s.entries), a)
				idx := b.NewBuffer(len(want))
				caps.Compressed.CompressedIndexTopK(idx, upload(b, q), upload(b, keys), upload(b, w), a)
				return read(b, idx), want
			}})
	}
	for _, s := range []struct{ m, heads, pos0, window, rate, topK, entries int }{
		{1, 8, 70, 32, 0, 0, 0}, {1, 8, 70, 32, 16, 0, 4}, {4, 4, 37, 16, 4, 6, 9}, {1, 16, 300, 128, 4, 32, 75},
	} {
		cs = append(cs, v4AttentionCase(fmt.Sprintf("m=%d/h=%d/pos=%d/win=%d/rate=%d/k=%d", s.m, s.heads, s.pos0, s.window, s.rate, s.topK),
			s.m, s.heads, 64, s.pos0, s.window, s.rate, s.topK, s.entries))
	}
	return cs
}
