package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/kernels"
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
	if !kernels.Available() {
		t.Skip("no CUDA driver or GPU")
	}
	for _, qwen3 := range []bool{false, true} {
		t.Run(fmt.Sprintf("qwen3=%v", qwen3), func(t *testing.T) {
			batched, alone := batchModelOn(t, qwen3, "cuda")
			vocab := batched.Config().VocabSize
			lengths := []int{1, 7, 300, 20, 20, 3, 60, 9}
			prompts := make([][]int, len(lengths))
			for i, n := range lengths {
				prompts[i] = testPrompt(i, n, vocab)
			}
			prompts[4] = append(slices.Clone(prompts[3][:17]), prompts[4][:5]...) // shares a block of 16 with 3
			opts := func(i int) GenerateOptions {
				o := GenerateOptions{MaxTokens: 24, StopTokens: []int{}}
				if i%2 == 1 {
					o.Sampling = SamplingOptions{Temperature: 0.9, TopK: 1 + 7*i, Seed: uint64(100 + i)}
				}
				return o
			}
			want := make([][]int, len(prompts))
			for i, p := range prompts {
				s, err := alone.NewSession(512)
				if err != nil {
					t.Fatal(err)
				}
				res, err := s.Generate(context.Background(), p, opts(i), nil)
				if err != nil {
					t.Fatal(err)
				}
				want[i] = res.Tokens
			}
			pool, err := batched.NewPool(PoolOptions{Sessions: len(prompts), ContextLength: 512, BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			if st := pool.Stats(); !st.Paged {
				t.Fatalf("the pool's cache is not paged on the GPU: %+v", st)
			}
			got := make([][]int, len(prompts))
			var wg sync.WaitGroup
			for i, p := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(i%3) * 3 * time.Millisecond) // join mid-run
					s, n, err := pool.Acquire(context.Background(), p)
					if err != nil {
						t.Error(err)
						return
					}
					defer pool.Release(s)
					res, err := s.Generate(context.Background(), p[n:], opts(i), nil)
					if err != nil {
						t.Error(err)
						return
					}
					got[i] = res.Tokens
				}()
			}
			wg.Wait()
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
