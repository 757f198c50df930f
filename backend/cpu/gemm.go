package cpu

// Prefill matmuls (m >= gemmMinRows tokens) of f32 and bf16 weights run as
// a matrix-matrix product tiled over tokens and features: a tile of 4
// weight rows by 3 tokens (12 accumulators, dot4x3) widens each chunk of 8
// weights once for the 3 tokens, and blocks of tokens whose activations fit
// in about 1 MiB are run over all of a thread's rows in turn, so the 4 rows
// stay in L1 across the block's tokens and the weights are streamed from
// memory once per block instead of once per token. bf16 weights on amd64
// take gemmWide instead (gemm_amd64.go: with AVX-512 4x6 tiles over packed
// activations; with AVX2 gemmPacked, each quad of rows widened to float32
// once a pass of k, 4x3 tiles over packed activations).

const (
	gemmMR      = 3       // tokens a tile
	gemmNR      = 4       // weight rows a tile
	gemmMinRows = 6       // fewer tokens take the per-row dot products
	gemmXBytes  = 1 << 20 // activations of a token block
)

// dot4x3Go is the portable 4x3 kernel: out[(3r+t)*8] holds the whole sum
// (the AVX2 kernels leave 8 partial sums per pair, the NEON ones 4 and 4
// zeros, which the caller adds).
func dot4x3Go[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) {
	*out = [96]float32{}
	for r := range gemmNR {
		for t := range gemmMR {
			var s float32
			for p := range k {
				s += widen(w[r*ldw+p]) * x[t*ldx+p]
			}
			out[(3*r+t)*8] = s
		}
	}
}

// dot4x3 is dot4x3Go with the SIMD kernels where the processor has them
// (has4x3: dot4x3BF16 and dot4x3F32, AVX2 on amd64, NEON on arm64); k is a
// multiple of 8.
func dot4x3[T float32 | uint16](w []T, ldw int, x []float32, ldx, k int, out *[96]float32) {
	if !has4x3 || k == 0 {
		dot4x3Go(w, ldw, x, ldx, k, out)
		return
	}
	_, _ = w[3*ldw+k-1], x[2*ldx+k-1]
	switch w := any(w).(type) {
	case []uint16:
		dot4x3BF16(&w[0], ldw, &x[0], ldx, k, out)
	case []float32:
		dot4x3F32(&w[0], ldw, &x[0], ldx, k, out)
	}
}

func widen[T float32 | uint16](v T) float32 {
	switch v := any(v).(type) {
	case uint16:
		return bf(v)
	case float32:
		return v
	}
	return 0
}

// gemmTile computes out[i*N+r] for the 3 tokens i0.. and the 4 rows r0..
// (all present: r0+4 <= N, i0+3 <= m).
func gemmTile[T float32 | uint16](out []float32, w []T, x []float32, K, N, i0, r0 int) {
	var acc [96]float32
	k8 := K &^ 7
	dot4x3(w[r0*K:], K, x[i0*K:], K, k8, &acc)
	for r := range gemmNR {
		wr := w[(r0+r)*K : (r0+r+1)*K]
		for t := range gemmMR {
			a := acc[(3*r+t)*8 : (3*r+t+1)*8]
			s := ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
			xt := x[(i0+t)*K : (i0+t+1)*K]
			for p := k8; p < K; p++ {
				s += widen(wr[p]) * xt[p]
			}
			out[(i0+t)*N+r0+r] = s
		}
	}
}

// gemmRows is MatMul's product for rows [lo, hi) of w (a multiple of 4
// apart from the matrix's last rows): token blocks over the rows, 4x3
// tiles, the leftover rows and tokens by dot products.
func gemmRows[T float32 | uint16](out, x []float32, w []T, m, K, N, lo, hi int, dot func(x []float32, w []T) float32) {
	block := max(gemmMR, gemmXBytes/(4*K)/gemmMR*gemmMR)
	hi4 := lo + (hi-lo)&^3
	for b0 := 0; b0 < m; b0 += block {
		b1 := min(b0+block, m)
		b3 := b0 + (b1-b0)/gemmMR*gemmMR
		for r := lo; r < hi4; r += gemmNR {
			for i := b0; i < b3; i += gemmMR {
				gemmTile(out, w, x, K, N, i, r)
			}
		}
		for i := range m {
			if i >= b0 && i < b3 {
				// Tiles covered rows [lo, hi4); leftover rows below.
				for r := hi4; r < hi; r++ {
					out[i*N+r] = dot(x[i*K:(i+1)*K], w[r*K:(r+1)*K])
				}
			} else if i >= b3 && i < b1 {
				for r := lo; r < hi; r++ {
					out[i*N+r] = dot(x[i*K:(i+1)*K], w[r*K:(r+1)*K])
				}
			}
		}
	}
}

// matmulGEMM is MatMul of a float32 or bf16 weight for m >= gemmMinRows
// tokens, parallel over quads of rows.
func (b *Backend) matmulGEMM(out, x []float32, w *Weight, m int) {
	if w.bf16 != nil && b.gemmWide(out, x, w, m) {
		return
	}
	K, N := w.cols, w.rows
	quads := (N + gemmNR - 1) / gemmNR
	b.parallel(quads, max(1, (1<<14)/(K*m)), func(lo, hi int) {
		r0, r1 := lo*gemmNR, min(hi*gemmNR, N)
		if w.bf16 != nil {
			gemmRows(out, x, w.bf16, m, K, N, r0, r1, dotBF16)
		} else {
			gemmRows(out, x, w.f32, m, K, N, r0, r1, dotF32)
		}
		w.addBias(out, m, r0, r1)
	})
}
