package engine

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// TestPoolPagedBatchedGPU: on the GPU, a pool's sessions (a paged cache:
// the paged kernels) generating at once, joining at different times with
// prompts of different lengths (one chunked, two sharing a prefix), half
// greedy and half drawing with top-k and a seed each (the batched steps'
// tokens picked on the device, backend.BatchTokenSampler), give the tokens
// each gives alone (its own cache, the unbatched model: the m = 1 kernels
// and the single-row sampler). Skipped without a GPU; the CPU runs the
// same pool in TestPoolPagedSharing and TestBatchedGenerateMatchesAlone.
func TestPoolPagedBatchedGPU(t *testing.T) {
	skipWithoutGPU(t)
	for _, qwen3 := range []bool{false, true} {
		t.Run(fmt.Sprintf("qwen3=%v", qwen3), func(t *testing.T) {
			batched, alone := batchModelOn(t, qwen3, "cuda")
			vocab := batched.Config().VocabSize
			prompts := mixedPrompts(vocab, 17) // 4 shares a block of 16 with 3
			opts := func(i int) GenerateOptions {
				o := GenerateOptions{MaxTokens: 24, StopTokens: []int{}}
				if i%2 == 1 {
					o.Sampling = SamplingOptions{Temperature: 0.9, TopK: 1 + 7*i, Seed: uint64(100 + i)}
				}
				return o
			}
			want := aloneTokens(t, alone, prompts, opts)
			pool, err := batched.NewPool(PoolOptions{Sessions: len(prompts), ContextLength: 512, BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			if st := pool.Stats(); !st.Paged {
				t.Fatalf("the pool's cache is not paged on the GPU: %+v", st)
			}
			got := concurrentTokens(t, prompts, func(i int, p []int) ([]int, error) {
				s, n, err := pool.Acquire(context.Background(), p)
				if err != nil {
					return nil, err
				}
				defer pool.Release(s)
				res, err := s.Generate(context.Background(), p[n:], opts(i), nil)
				if err != nil {
					return nil, err
				}
				return res.Tokens, nil
			})
			for i := range prompts {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("session %d (%d prompt tokens, %+v): batched %v, alone %v", i, len(prompts[i]), opts(i).Sampling, got[i], want[i])
				}
			}
			st := batched.BatchStats()
			if st.Steps == 0 || st.Sequences <= st.Steps {
				t.Errorf("no step was batched: %+v", st)
			}
			t.Logf("%+v: mean batch %.1f", st, float64(st.Sequences)/float64(st.Steps))
		})
	}
}

// BenchmarkPoolLlama8B is issue 60's serving benchmark in process: c
// requests at once through a Pool (c sessions), each a distinct 512-token
// prompt and 256 greedy output tokens, at the Llama-3-8B shape (NVFP4
// linears, random weights), with the paged cache (the default: paged
// kernels, batched steps, batched picks on the device) and with a cache a
// session (PoolOptions.Unpaged), alternating, in one run; it reports the
// output tokens/s of each (prefill included) and their ratio, and of the
// paged run's last round its steps, mean batch and the gathers that
// waited out BatchOptions.Gather (a step held for a straggler).
// MANIFOLD_BENCH_DIR may name BenchmarkDecodeLlama8B's checkpoint folder.
func BenchmarkPoolLlama8B(b *testing.B) {
	benchPool(b, "llama3-8b", "MANIFOLD_BENCH_DIR", testmodel.Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256,
		DType: weights.BF16, NVFP4: true, Seed: 1})
}

// BenchmarkPoolQwen3_8B is BenchmarkPoolLlama8B at the Qwen3-8B shape (36
// layers, FFN 12288, q/k norms, vocab 151936). MANIFOLD_BENCH_DIR_QWEN3
// may name a folder for its checkpoint.
func BenchmarkPoolQwen3_8B(b *testing.B) {
	benchPool(b, "qwen3-8b", "MANIFOLD_BENCH_DIR_QWEN3", testmodel.Llama{Layers: 36, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128,
		Vocab: 151936, DType: weights.BF16, NVFP4: true, Qwen3: true, Seed: 1})
}

// benchPool runs the pool benchmark on spec's checkpoint (in env's folder
// where set); each pool is dropped and collected before the next, whose
// cache then has the GPU's memory (at c = 256 a cache takes 50 GB).
func benchPool(b *testing.B, name, env string, spec testmodel.Llama) {
	skipWithoutGPU(b)
	dir := benchCheckpoint(b, env, spec)
	const prompt, output = 512, 256
	m, err := Load(dir, Options{Device: "cuda", ContextLength: prompt + output})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, c := range []int{1, 8, 32, 128, 256} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			var rates [2]float64          // paged, unpaged
			var steps, seqs, waited int64 // the paged pool's steps, their sequences, gathers that waited out Gather
			for b.Loop() {
				for i, unpaged := range []bool{false, true} {
					p, err := m.NewPool(PoolOptions{Sessions: c, ContextLength: prompt + output, Unpaged: unpaged})
					if err != nil {
						b.Fatal(err)
					}
					st0, w0 := m.BatchStats(), m.sched.gatherTimeouts()
					rates[i] = concurrentRate(b, c, output, func(j int) error {
						return poolRequest(p, testPrompt(1000*i+j, prompt, spec.Vocab), output)
					})
					if st := m.BatchStats(); !unpaged {
						steps, seqs, waited = st.Steps-st0.Steps, st.Sequences-st0.Sequences, m.sched.gatherTimeouts()-w0
					}
					p.Close()
					p = nil
					runtime.GC() // the cache's device memory goes back once collected
					runtime.GC()
					time.Sleep(200 * time.Millisecond)
				}
			}
			b.ReportMetric(rates[0], "paged-tok/s")
			b.ReportMetric(rates[1], "unpaged-tok/s")
			b.ReportMetric(rates[0]/rates[1], "ratio")
			fmt.Printf("RESULT pool %s c=%d paged_tok_s=%.0f unpaged_tok_s=%.0f ratio=%.2f paged_steps=%d mean_batch=%.1f gather_timeouts=%d\n",
				name, c, rates[0], rates[1], rates[0]/rates[1], steps, float64(seqs)/float64(max(steps, 1)), waited)
		})
	}
}
