package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// BenchmarkPagedPrefix measures the prefill a paged pool saves: a request
// of a 496-token system prompt and a 16-token question, on the CPU, for a
// Llama-shape model with random weights (4 layers, hidden 512, FFN 1408, 8
// heads, 4 KV heads, bf16). cold: a system prompt no request ran before
// (the whole prompt runs); shared: the same system prompt every time (its
// 31 cached blocks of 16 are shared; the question runs). Alternate them
// (-count) and compare the ratio.
func BenchmarkPagedPrefix(b *testing.B) {
	m := pagedBenchModel(b)
	vocab := m.Config().VocabSize
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "cold", true: "shared"}[shared], func(b *testing.B) {
			p, err := m.NewPool(PoolOptions{Sessions: 2, ContextLength: 1024})
			if err != nil {
				b.Fatal(err)
			}
			seed, ran := 1, 0
			request := func(i int) {
				prompt := append(testPrompt(seed, 496, vocab), testPrompt(1000+i, 16, vocab)...)
				s, n, err := p.Acquire(context.Background(), prompt)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Append(context.Background(), prompt[n:]); err != nil {
					b.Fatal(err)
				}
				ran += len(prompt) - n
				p.Release(s)
			}
			request(-1) // shared: the system prompt's first run
			ran = 0
			for i := 0; b.Loop(); i++ {
				if !shared {
					seed++
				}
				request(i)
			}
			b.ReportMetric(float64(ran)/float64(b.N), "prefill-tokens/op")
		})
	}
}

func pagedBenchModel(b *testing.B) *Model {
	spec := testmodel.Llama{Layers: 4, Hidden: 512, FFN: 1408, Heads: 8, KVHeads: 4, Vocab: 4096, DType: weights.BF16, Seed: 3}
	m, err := Load(testmodel.WriteTemp(b, spec), Options{ContextLength: 1024})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkPagedDecode is a decode step after a 768-token prompt on
// BenchmarkPagedPrefix's model, with a cache a session (unpaged) and in
// blocks of 16: what reading keys through a block table costs.
func BenchmarkPagedDecode(b *testing.B) {
	m := pagedBenchModel(b)
	prompt := testPrompt(1, 768, m.Config().VocabSize)
	for _, unpaged := range []bool{true, false} {
		b.Run(map[bool]string{true: "unpaged", false: "paged"}[unpaged], func(b *testing.B) {
			p, err := m.NewPool(PoolOptions{Sessions: 1, ContextLength: 1024, Unpaged: unpaged})
			if err != nil {
				b.Fatal(err)
			}
			s, _, err := p.Acquire(context.Background(), prompt)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Append(context.Background(), prompt); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if s.Len() == s.ContextLength() {
					s.Truncate(len(prompt))
				}
				if _, err := s.Append(context.Background(), []int{7}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestPagedBlocksRunOut: two sessions whose generations need more blocks
// than the pool has. The scheduler holds a step's request back while its
// blocks are taken; when neither can run, one fails with model.ErrNoBlocks,
// its release frees its blocks, and the other goes on to generate what a
// fresh session does.
func TestPagedBlocksRunOut(t *testing.T) {
	batched, alone := batchModel(t, false)
	vocab := batched.Config().VocabSize
	p, err := batched.NewPool(PoolOptions{Sessions: 2, ContextLength: 32, BlockSize: 4, Blocks: 6})
	if err != nil {
		t.Fatal(err)
	}
	opts := GenerateOptions{MaxTokens: 12, StopTokens: []int{}}
	prompts := [][]int{testPrompt(1, 8, vocab), testPrompt(2, 8, vocab)}
	type result struct {
		i      int
		tokens []int
		err    error
	}
	results := make(chan result, len(prompts))
	var first sync.WaitGroup // both prompts have run
	first.Add(len(prompts))
	for i, prompt := range prompts {
		s, n, err := p.Acquire(context.Background(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			once := sync.OnceFunc(func() { first.Done(); first.Wait() })
			res, err := s.Generate(context.Background(), prompt[n:], opts, func(Token) error { once(); return nil })
			p.Release(s)
			var toks []int
			if res != nil {
				toks = res.Tokens
			}
			results <- result{i, toks, err}
		}()
	}
	failed := 0
	for range prompts {
		r := <-results
		if r.err != nil {
			if !errors.Is(r.err, model.ErrNoBlocks) {
				t.Errorf("session %d: %v, want ErrNoBlocks", r.i, r.err)
			}
			failed++
			continue
		}
		fresh, _ := alone.NewSession(32)
		want, _ := fresh.Generate(context.Background(), prompts[r.i], opts, nil)
		if !slices.Equal(r.tokens, want.Tokens) {
			t.Errorf("session %d: %v, fresh %v", r.i, r.tokens, want.Tokens)
		}
	}
	if failed != 1 {
		t.Errorf("%d sessions failed, want 1", failed)
	}
	if st := p.Stats(); st.FreeBlocks != st.Blocks {
		t.Errorf("after both released: %d of %d blocks free", st.FreeBlocks, st.Blocks)
	}
}
