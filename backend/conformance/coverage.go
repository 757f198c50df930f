package conformance

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// coverageCases are rows for CUDA kernels that a default path launches but
// that no other row reached (kernels' TestConformanceCoverage, issue 55):
// each row names the kernel it is there for, and its comment says why the
// GPU's default choice takes that kernel at that shape (kernels/backend.go,
// bf16.go, fuse.go, paged.go, dsv4.go, sample.go). The sizes follow an
// H100's or H200's (132 multiprocessors, 227 KB of shared memory a block)
// and keep clear of their thresholds. The image's kernels that no default path
// launches have no row: gemm16_f16_t* and gemm16_x_f16 (f16
// weights are widened to f32 at upload; only kernels' TestGemm16 runs
// them), gemv_bf16_pf and gemv_fp8_m4 (only forced: TestConformance's
// bf16-gemv-prefetch and fp8-gemv-every-m variants).
func coverageCases() []Case {
	var cs []Case
	for _, s := range []struct {
		kernel         string
		f              backend.Format
		m, rows, cols  int
		bias, residual bool
	}{
		// bf16 at m = 1, K % 8 == 0, more rows than 8 a multiprocessor (a
		// block a row below) and fewer than 32768: gemv16Lone's warp a row
		// with one load in flight.
		{"gemv_bf16", backend.BF16, 1, 2100, 64, false, false},
		// bf16 at m = 1 with 32768 rows or more (an LM head): four loads in flight.
		{"gemv_bf16_u4", backend.BF16, 1, 32768, 72, false, false},
		// bf16 at 1 < m < g16MinM (5) past 8 rows a multiprocessor.
		{"gemv_bf16_u4", backend.BF16, 3, 2100, 64, true, false},
		// bf16 at m = 33..64 (K % 8 == 0): g16Pick's tile of 64 tokens.
		{"gemm16_bf16_t64", backend.BF16, 40, 130, 264, true, false},
		// bf16 at m >= kernels' cublasMinMDefault (64) with a bias, N odd:
		// where libcublas loads, x split into halves (gemm16_x_bf16), one
		// cublasGemmEx over both (below blasStackedMaxM, 256 rows), the
		// halves and the bias added by blas_add_halves (kernels/cublas.go);
		// else gemm16_bf16_t128.
		{"cublasGemmEx,blas_add_halves", backend.BF16, 130, 77, 264, true, false},
		// NVFP4 past kernels' cublasNVFP4MinMDefault (512; 2050 keeps clear
		// of a threshold raised to 2048) with a bias, N odd: where libcublas
		// loads, x in fp16 (blas_x_f16), the weight dequantized
		// (blas_nvfp4_f16), cublasGemmEx; else gemm_nvfp4_t*.
		{"cublasGemmEx,blas_x_f16,blas_nvfp4_f16", backend.NVFP4, 2050, 129, 256, true, false},
		// NVFP4 at m = 1, K % 256 == 0 but not % 2048: written for the staged
		// kernels (gemv_nvfp4_s1_d1_lb, 17 tiles; _mt, 300 tiles), which the
		// bulk-copy kernel's partial last stage has taken over since (an H100
		// launched gemv_nvfp4_tma8 for both): they now cover its tail. The
		// staged kernels stay the default only where x's 2K bytes leave no
		// two ring slots (K from about 37k), which no row reaches yet.
		{"gemv_nvfp4_tma8-tail", backend.NVFP4, 1, 257, 1280, false, false},
		{"gemv_nvfp4_tma8-tail", backend.NVFP4, 1, 4800, 768, false, false},
		// NVFP4 at m = 1, K % 2048 != 0, x (2K bytes in fp16) too wide to
		// stage beside 16 warps' pipelines (16·2·2304 + 2K > 227 KB from K
		// = 78848): x streamed with the weights.
		{"gemv_nvfp4_m1_d1", backend.NVFP4, 1, 40, 80128, false, false},
		// NVFP4 at m = 1, K % 2048 == 0 (the bulk-copy kernel), one weight
		// of K <= 4096 with the residual add as its epilogue reading
		// tmaMapsResMin (16 M) elements or more: tensor copies.
		{"gemv_nvfp4_tma8_tm", backend.NVFP4, 1, 4096, 4096, false, true},
	} {
		tol, q8 := 4e-3, 0.0
		switch {
		case s.f == backend.NVFP4:
			q8 = nvfp4Q8Tol
		case s.m >= 5: // the bf16 GEMM takes x as two 16-bit halves
			tol = 1e-4
		}
		op, shape := "MatMul", fmt.Sprintf("%s/%s/m=%d/%dx%d", s.kernel, s.f, s.m, s.rows, s.cols)
		if s.bias {
			shape += "/bias"
		}
		if s.residual {
			op = "MatMul,Add"
		}
		cs = append(cs, Case{Op: op, Shape: shape, Tol: tol, Q8Tol: q8,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				if s.residual {
					return matmulResidual(b, rng, s.f, s.m, s.rows, s.cols)
				}
				return matmul(b, rng, s.f, s.m, s.rows, s.cols, s.bias)
			}})
	}
	// Attention (the cache helper's context is a prefill, then m rows).
	for _, s := range []struct {
		kernel                         string
		heads, kv, hd, pos0, m, window int
	}{
		// A head size off the multiples of 4: the generic kernel, whose
		// launch copies k and v into the cache first.
		{"attention", 4, 2, 42, 20, 2, 0},
		// A head size past 256, under a sliding window: the same.
		{"attention", 2, 1, 288, 30, 1, 9},
		// Head size 128, 1 < m < 32 (attn_prefill from 32 rows), 523 keys
		// in a cache of as many: the keys split in two (m <= 4 and at least
		// 512 of them), merged by attn_combine.
		{"attention_kv_128,attn_combine", 2, 1, 128, 520, 3, 0},
		// m = 1, head size 128, 101 keys: every key of the (kv head, head
		// group) fits one block's shared memory (attn_short up to about 200
		// keys at 128).
		{"attn_short_128", 8, 2, 128, 100, 1, 0},
		// m = 1, head size 64, 1001 keys: more than two shares of
		// attn_short hold (about 420 keys each at 64), so attn_decode.
		{"attn_decode_64", 2, 1, 64, 1000, 1, 0},
	} {
		cs = append(cs, Case{Op: "Attention", Shape: fmt.Sprintf("%s/h=%d/kv=%d/d=%d/pos=%d/m=%d/win=%d", s.kernel, s.heads, s.kv, s.hd, s.pos0, s.m, s.window), Tol: 2e-5,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				as := layers.AttentionShape{Heads: s.heads, KVHeads: s.kv, HeadDim: s.hd, Scale: float32(1 / math.Sqrt(float64(s.hd))), Window: s.window}
				return attention(b, rng, as, s.pos0, s.m)
			}})
	}
	// Qwen3's per-head q and k RMSNorms, in place, then RoPE of q and k, then a
	// one-row attention: the norms and the rotation move into the attention
	// launch (kernels' attnRow), attn_short_128 at 101 keys and attn_decode_64
	// at 1001 (as the rows above).
	for _, s := range []struct {
		kernel              string
		heads, kv, hd, pos0 int
	}{{"attn_short_128", 8, 2, 128, 100}, {"attn_decode_64", 4, 1, 64, 1000}} {
		cs = append(cs, Case{Op: "RMSNorm,RoPE,Attention", Shape: fmt.Sprintf("%s+qknorm/h=%d/kv=%d/d=%d/pos=%d/m=1", s.kernel, s.heads, s.kv, s.hd, s.pos0), Tol: 2e-5,
			Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				as := layers.AttentionShape{Heads: s.heads, KVHeads: s.kv, HeadDim: s.hd, Scale: float32(1 / math.Sqrt(float64(s.hd)))}
				return attentionQKNorm(b, rng, as, s.pos0)
			}})
	}
	// The same norms and RoPE over several rows (a prompt chunk or a batch,
	// whose attention takes no RoPE in): one rope_norm_dyn launch.
	cs = append(cs, Case{Op: "RMSNorm,RoPE", Shape: "rope_norm_dyn/rows=6/h=8/kv=2/d=128", Tol: 2e-5,
		Run: func(b backend.Backend, _ backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			const rows, heads, kv, hd, eps = 6, 8, 2, 128, 1e-6
			r := must(layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: 1}, hd))
			q, k, qn, kn := rnd(rng, rows*heads*hd, 1), rnd(rng, rows*kv*hd, 1), rnd(rng, hd, 1), rnd(rng, hd, 1)
			want := append(append([]float32(nil), q...), k...)
			wq, wk := want[:len(q)], want[len(q):]
			layers.RMSNorm(wq, wq, qn, eps)
			layers.RMSNorm(wk, wk, kn, eps)
			layers.ApplyRoPE(wq, rows, heads, hd, 0, 40, r, false)
			layers.ApplyRoPE(wk, rows, kv, hd, 0, 40, r, false)
			qb, kb := upload(b, q), upload(b, k)
			b.RMSNorm(qb, qb, upload(b, qn), eps)
			b.RMSNorm(kb, kb, upload(b, kn), eps)
			b.RoPE(qb, rows, heads, hd, 0, 40, r, false)
			b.RoPE(kb, rows, kv, hd, 0, 40, r, false)
			return append(read(b, qb), read(b, kb)...), want
		}})
	// paged_attn_64_g4_rope: decode rows only (the append moves into the
	// attention), heads of 64, 4 query heads a kv head (paged_attn_*_g4).
	cs = append(cs, Case{Op: "PagedAttentionOps.PagedAppendRoPE", Shape: "paged_attn_64_g4_rope/bs=16/h=8/kv=2/d=64/seqs=40+1,3+1,17+1", Tol: 2e-5, Needs: "PagedAttentionOps",
		Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
			r := must(layers.NewRoPE(layers.RoPEParams{Theta: 5e5, PartialRotaryFactor: 1}, 64))
			as := layers.AttentionShape{Heads: 8, KVHeads: 2, HeadDim: 64, Scale: 1. / 8}
			return pagedAppendRoPE(b, caps.Paged, rng, 16, as, r, []pagedSeq{{40, 1, 0}, {3, 1, 0}, {17, 1, 0}})
		}})
	// The same with Qwen3's q and k norms before (heads of 128, 8 query
	// heads a kv head: paged_attn_128_rope), which move into the launch
	// too; and with a prompt's rows beside (paged_append takes them in,
	// then paged_prefill and paged_attn_128).
	for _, sq := range [][]pagedSeq{{{40, 1, 0}, {3, 1, 0}, {17, 1, 0}}, {{40, 1, 0}, {0, 40, 0}}} {
		name := "paged_attn_128_rope"
		if len(sq) == 2 {
			name = "paged_append,paged_prefill_128,paged_attn_128"
		}
		cs = append(cs, Case{Op: "RMSNorm,PagedAttentionOps.PagedAppendRoPE", Shape: fmt.Sprintf("%s+qknorm/bs=16/h=16/kv=2/d=128/seqs=%d", name, len(sq)), Tol: 2e-5, Needs: "PagedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				r := must(layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: 1}, 128))
				as := layers.AttentionShape{Heads: 16, KVHeads: 2, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
				return pagedAppendRoPENorm(b, caps.Paged, rng, 16, as, r, sq, true)
			}})
	}
	// The indexer's top-k for a few rows (at most 4) of at least 16384
	// entries: the cluster top-k while its shared memory holds the row
	// (clusters of 16 from 65536 entries where the GPU runs them, as an
	// H100 does, up to about 712000 entries), then the many-block passes
	// (up to 2^20 entries).
	for _, s := range []struct {
		kernels string
		entries int
	}{{"tkc_select", 20000}, {"tkc_select16", 70000}, {"tkm_hist,tkm_count,tkm_emit", 800000}} {
		cs = append(cs, Case{Op: "CompressedAttentionOps.CompressedIndexTopK", Shape: fmt.Sprintf("%s/entries=%d", s.kernels, s.entries), Tol: 0, Needs: "CompressedAttentionOps",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return indexTopK(b, caps.Compressed, rng, s.entries)
			}})
	}
	// sample_partial, sample_final: one row's pick (TokenSampler.SampleToken
	// and TokenPipeliner.SampleTokenTo, the engine's single-sequence path).
	for _, s := range []struct {
		vocab  int
		coarse bool
	}{{777, true}, {128256, false}} {
		cs = append(cs, Case{Op: "TokenSampler.SampleToken", Shape: fmt.Sprintf("sample_partial,sample_final/vocab=%d/ties=%v", s.vocab, s.coarse), Needs: "TokenSampler",
			Run: func(b backend.Backend, caps backend.Capabilities, rng *rand.Rand) ([]float32, []float32) {
				return sampleOne(b, caps, rng, s.vocab, s.coarse)
			}})
	}
	return cs
}

// matmulResidual is matmul followed by Add(r, r, y) of a random residual r,
// as a layer's output projection; it returns r. A backend may run the add
// as the matmul's epilogue.
func matmulResidual(b backend.Backend, rng *rand.Rand, f backend.Format, m, rows, cols int) ([]float32, []float32) {
	wv, hw := weight(rng, f, rows, cols)
	x, r := rnd(rng, m*cols, 1), rnd(rng, m*rows, 1)
	want := make([]float32, m*rows)
	refMatMul(want, x, wv, nil, m, rows, cols, cols, rows)
	for i, v := range r {
		want[i] += v
	}
	w := must(b.Upload(hw))
	xb, rb, y := upload(b, x), upload(b, r), b.NewBuffer(m*rows)
	b.MatMul(y, xb, w, m)
	b.Add(rb, rb, y)
	return read(b, rb), want
}

// indexTopK is CompressedIndexTopK of two queries (the first seeing all
// entries but the last two, the second all but one) over entries keys of
// 4 dims with 2 heads, 32 picked, against layers/dsv4. The heads' weights
// are positive, so that the picks are scores above zero, far apart at the
// 32nd: no near tie between the GPU's float32 sums and the reference's.
func indexTopK(b backend.Backend, ops backend.CompressedAttentionOps, rng *rand.Rand, entries int) ([]float32, []float32) {
	const m, heads, dim, rate = 2, 2, 4, 4
	a := dsv4.IndexArgs{M: m, Heads: heads, Dim: dim, Entries: entries, TopK: 32, Pos0: rate*entries - 6, Rate: rate, Scale: 0.5}
	q, keys, w := rnd(rng, m*heads*dim, 1), rnd(rng, entries*dim, 1), rnd(rng, m*heads, 1)
	for i, v := range w {
		w[i] = 0.1 + float32(math.Abs(float64(v)))
	}
	want := make([]float32, m*a.TopK)
	dsv4.IndexTopK(want, q, keys, w, make([]float32, entries), a)
	idx := b.NewBuffer(len(want))
	ops.CompressedIndexTopK(idx, upload(b, q), upload(b, keys), upload(b, w), a)
	return read(b, idx), want
}

// sampleOne picks from one row of vocab logits (on a grid of 1/4 with
// coarse: many ties) greedily and by draws of top-k 1, 40 and
// MaxSampleTopK, with SampleToken and (where the backend has it)
// SampleTokenTo, against backend/cpu.SampleToken: the same ids exactly.
func sampleOne(b backend.Backend, caps backend.Capabilities, rng *rand.Rand, vocab int, coarse bool) ([]float32, []float32) {
	logits := rnd(rng, vocab, 3)
	if coarse {
		for i, v := range logits {
			logits[i] = float32(math.Round(float64(v)*4) / 4)
		}
	}
	lb := upload(b, logits)
	var got, want []float32
	for _, o := range []struct {
		temp float32
		k    int
	}{{0, 0}, {0.7, 1}, {1, 40}, {1.3, backend.MaxSampleTopK}} {
		u := rng.Float64()
		id := float32(must(cpu.SampleToken(logits, o.temp, o.k, u)))
		got, want = append(got, float32(must(caps.Sampler.SampleToken(lb, o.temp, o.k, u)))), append(want, id)
		if p := caps.Pipeliner; p != nil {
			pend := must(p.SampleTokenTo(b.NewBuffer(1), lb, o.temp, o.k, u))
			got, want = append(got, float32(must(pend.Wait()))), append(want, id)
		}
	}
	return got, want
}

// attentionQKNorm is one row's attention at pos0 (a context of random keys
// and values before it) after in-place per-head RMSNorms of q and k (eps
// 1e-6) and RoPE of both, the order of Qwen3's decoder.
func attentionQKNorm(b backend.Backend, rng *rand.Rand, s layers.AttentionShape, pos0 int) ([]float32, []float32) {
	row, qw := s.KVHeads*s.HeadDim, s.Heads*s.HeadDim
	keys, values := rnd(rng, (pos0+1)*row, 1), rnd(rng, (pos0+1)*row, 1)
	q, qn, kn := rnd(rng, qw, 1), rnd(rng, s.HeadDim, 1), rnd(rng, s.HeadDim, 1)
	r := must(layers.NewRoPE(layers.RoPEParams{Theta: 1e6, PartialRotaryFactor: 1}, s.HeadDim))
	const eps = 1e-6
	qc, kc := append([]float32(nil), q...), append([]float32(nil), keys[pos0*row:]...)
	layers.RMSNorm(qc, qc, qn, eps)
	layers.RMSNorm(kc, kc, kn, eps)
	layers.ApplyRoPE(qc, 1, s.Heads, s.HeadDim, 0, pos0, r, false)
	layers.ApplyRoPE(kc, 1, s.KVHeads, s.HeadDim, 0, pos0, r, false)
	want := make([]float32, qw)
	layers.Attention(want, qc, append(keys[:pos0*row:pos0*row], kc...), values, 1, pos0, s)
	cache := must(b.NewKVCache(backend.KVShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: pos0 + 1}))
	pq := b.NewBuffer(pos0 * qw) // the context, appended as a prefill whose output is dropped
	b.Attention(b.NewBuffer(pq.Len()), pq, upload(b, keys[:pos0*row]), upload(b, values[:pos0*row]), cache, 0, 0, pos0, s)
	qb, kb, out := upload(b, q), upload(b, keys[pos0*row:]), b.NewBuffer(qw)
	b.RMSNorm(qb, qb, upload(b, qn), eps)
	b.RMSNorm(kb, kb, upload(b, kn), eps)
	b.RoPE(qb, 1, s.Heads, s.HeadDim, 0, pos0, r, false)
	b.RoPE(kb, 1, s.KVHeads, s.HeadDim, 0, pos0, r, false)
	b.Attention(out, qb, kb, upload(b, values[pos0*row:]), cache, 0, pos0, 1, s)
	return read(b, out), want
}
