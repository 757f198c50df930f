package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/model"
)

// TestPoolPrefixReuse: a request whose prompt extends an earlier one's
// reuses the shared prefix, and generates what a fresh session generates:
// unpaged, that session comes back holding it; paged, the prefix's whole
// blocks are shared (of 16 positions: 16 of the 20).
func TestPoolPrefixReuse(t *testing.T) {
	batched, alone := batchModel(t, false)
	for _, tc := range []struct {
		opts PoolOptions
		want []int
	}{
		{PoolOptions{Unpaged: true}, []int{0, 20, 0, 20}},
		{PoolOptions{BlockSize: 4}, []int{0, 20, 0, 20}},
		{PoolOptions{}, []int{0, 16, 0, 16}},
	} {
		tc.opts.Sessions, tc.opts.ContextLength = 2, 128
		p, err := batched.NewPool(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		vocab := batched.Config().VocabSize
		sys := testPrompt(1, 20, vocab)
		opts := GenerateOptions{MaxTokens: 8, StopTokens: []int{}}
		for i, prompt := range [][]int{sys, append(slices.Clone(sys), 5, 6, 7), testPrompt(3, 9, vocab), append(slices.Clone(sys), 8)} {
			s, n, err := p.Acquire(context.Background(), prompt)
			if err != nil {
				t.Fatal(err)
			}
			res, err := s.Generate(context.Background(), prompt[n:], opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			fresh, _ := alone.NewSession(128)
			want, err := fresh.Generate(context.Background(), prompt, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Tokens, want.Tokens) {
				t.Errorf("%+v: request %d (reusing %d tokens): %v, fresh %v", tc.opts, i, n, res.Tokens, want.Tokens)
			}
			if n != tc.want[i] {
				t.Errorf("%+v: request %d reused %d tokens, want %d", tc.opts, i, n, tc.want[i])
			}
			p.Release(s)
		}
		if st := p.Stats(); st.ReusedTokens != int64(2*tc.want[1]) || st.Busy != 0 || st.Paged == tc.opts.Unpaged {
			t.Errorf("%+v: stats %+v", tc.opts, st)
		}
	}
}

// TestPoolPagedSharing: paged, sessions generating at once share a system
// prompt's blocks (one unpaged session could not: its holder is busy), and
// generate what fresh sessions do; a request waits while the free blocks
// cannot hold its prompt, and one that no pool could hold fails with
// model.ErrNoBlocks.
func TestPoolPagedSharing(t *testing.T) {
	batched, alone := batchModel(t, false)
	vocab := batched.Config().VocabSize
	sys := testPrompt(1, 24, vocab)
	p, err := batched.NewPool(PoolOptions{Sessions: 4, ContextLength: 64, BlockSize: 4, Blocks: 16})
	if err != nil {
		t.Fatal(err)
	}
	opts := GenerateOptions{MaxTokens: 6, StopTokens: []int{}}
	a, _, err := p.Acquire(context.Background(), sys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Generate(context.Background(), sys, opts, nil); err != nil {
		t.Fatal(err)
	}
	prompts := [][]int{append(slices.Clone(sys), 3), append(slices.Clone(sys), 4, 5)}
	got := make([][]int, len(prompts))
	errs := make(chan error, len(prompts))
	for i, prompt := range prompts {
		s, n, err := p.Acquire(context.Background(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		if n != 24 {
			t.Errorf("session %d shares %d positions, want 24", i, n)
		}
		go func() {
			res, err := s.Generate(context.Background(), prompt[n:], opts, nil)
			got[i] = res.Tokens
			errs <- err
			p.Release(s)
		}()
	}
	for range prompts {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, prompt := range prompts {
		fresh, _ := alone.NewSession(64)
		want, _ := fresh.Generate(context.Background(), prompt, opts, nil)
		if !slices.Equal(got[i], want.Tokens) {
			t.Errorf("session %d: %v, fresh %v", i, got[i], want.Tokens)
		}
	}
	// a holds 8 blocks; a prompt of 40 other tokens needs 10 of the 8
	// free: it waits for a's release.
	done := acquireLater(p, testPrompt(5, 40, vocab))
	select {
	case err := <-done:
		t.Fatalf("admitted past the free blocks: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	p.Release(a)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Acquire(context.Background(), testPrompt(6, 65, vocab)); !errors.Is(err, model.ErrNoBlocks) {
		t.Errorf("a prompt past the pool: %v, want ErrNoBlocks", err)
	}
}

// TestPoolAdmission: past Sessions requests wait, past MaxQueue they fail
// with ErrQueueFull, a cancelled wait ends, and Close fails the waiters.
func TestPoolAdmission(t *testing.T) {
	batched, _ := batchModel(t, false)
	p, err := batched.NewPool(PoolOptions{Sessions: 1, ContextLength: 16, MaxQueue: 1})
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := p.Acquire(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(p, nil)
	for p.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, _, err := p.Acquire(context.Background(), nil); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third request: %v, want ErrQueueFull", err)
	}
	p.Release(s)
	if err := <-got; err != nil {
		t.Errorf("waiting request: %v", err)
	}
	s, _, _ = p.Acquire(context.Background(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := p.Acquire(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled wait: %v", err)
	}
	go func() {
		_, _, err := p.Acquire(context.Background(), nil)
		got <- err
	}()
	for p.Stats().Waiting == 0 {
		time.Sleep(time.Millisecond)
	}
	p.Close()
	if err := <-got; !errors.Is(err, ErrPoolClosed) {
		t.Errorf("waiter at Close: %v", err)
	}
	p.Release(s)
	if _, _, err := p.Acquire(context.Background(), nil); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("after Close: %v", err)
	}
	for _, o := range []PoolOptions{{Sessions: -1}, {BlockSize: -1}, {Blocks: -1}, {BlockSize: 1 << 20, Blocks: 1 << 20}} {
		if _, err := batched.NewPool(o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// acquireLater acquires a session for prompt in a goroutine, releases it,
// and sends Acquire's error.
func acquireLater(p *Pool, prompt []int) chan error {
	done := make(chan error, 1)
	go func() {
		s, _, err := p.Acquire(context.Background(), prompt)
		if err == nil {
			p.Release(s)
		}
		done <- err
	}()
	return done
}
