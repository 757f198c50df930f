package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestPoolPrefixReuse: a request whose prompt extends an earlier one's gets
// that session back holding the shared prefix, and generates what a fresh
// session generates.
func TestPoolPrefixReuse(t *testing.T) {
	batched, alone := batchModel(t, false)
	p, err := batched.NewPool(PoolOptions{Sessions: 2, ContextLength: 128})
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
			t.Errorf("request %d (reusing %d tokens): %v, fresh %v", i, n, res.Tokens, want.Tokens)
		}
		if wantN := []int{0, 20, 0, 20}[i]; n != wantN {
			t.Errorf("request %d reused %d tokens, want %d", i, n, wantN)
		}
		p.Release(s)
	}
	if st := p.Stats(); st.ReusedTokens != 40 || st.Busy != 0 {
		t.Errorf("stats %+v", st)
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
	got := make(chan error, 1)
	go func() {
		s2, _, err := p.Acquire(context.Background(), nil)
		if err == nil {
			p.Release(s2)
		}
		got <- err
	}()
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
	if _, err := batched.NewPool(PoolOptions{Sessions: -1}); err == nil {
		t.Error("Sessions -1: no error")
	}
}
