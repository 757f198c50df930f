package engine

import (
	"context"
	"errors"
	"iter"
	"sync"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
)

// TestCloseDuringGenerate closes the model from another goroutine while a
// session generates on the CPU (run with -race): the generation stops at
// its next step with ErrClosed instead of running on unmapped weights.
func TestCloseDuringGenerate(t *testing.T) { checkCloseDuringGenerate(t, "cpu") }

// TestCloseDuringGenerateGPU is TestCloseDuringGenerate on the GPU, where
// the backend's memory (weights and caches) must outlive the calls in flight.
func TestCloseDuringGenerateGPU(t *testing.T) {
	skipWithoutGPU(t)
	checkCloseDuringGenerate(t, "cuda")
}

func checkCloseDuringGenerate(t *testing.T, device string) {
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	prompt := ints(ref.InputIDs[:8])
	ctx := context.Background()
	forever := GenerateOptions{StopTokens: []int{}} // until the context is full

	t.Run("from the stream", func(t *testing.T) {
		m, err := Load(dir, Options{Device: device})
		if err != nil {
			t.Fatal(err)
		}
		s, err := m.NewSession(0)
		if err != nil {
			t.Fatal(err)
		}
		idle, err := m.NewSession(64)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idle.Append(ctx, prompt); err != nil {
			t.Fatal(err)
		}
		const at = 5
		res, err := s.Generate(ctx, prompt, forever, func(tok Token) error {
			if tok.Index == at {
				// Close in another goroutine; it returns while this call is in flight.
				done := make(chan error)
				go func() { done <- m.Close() }()
				if err := <-done; err != nil {
					t.Errorf("Close: %v", err)
				}
				if m.released() {
					t.Error("weights released while a call is in flight")
				}
				if _, err := m.NewSession(16); !errors.Is(err, ErrClosed) {
					t.Errorf("NewSession after Close: %v, want ErrClosed", err)
				}
			}
			return nil
		})
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Generate across Close: %v, want ErrClosed", err)
		}
		if len(res.Tokens) != at+1 || s.Len() != len(prompt)+at+1 {
			t.Errorf("%d tokens generated, session of %d: want %d and %d", len(res.Tokens), s.Len(), at+1, len(prompt)+at+1)
		}
		if !m.released() {
			t.Error("weights not released after the last call returned")
		}
		for what, err := range map[string]error{
			"Generate":           second(s.Generate(ctx, nil, forever, nil)),
			"Append":             second(idle.Append(ctx, []int{3})),
			"Stream":             streamErr(idle.Stream(ctx, []int{3}, forever)),
			"Chat":               second(s.Chat(ctx, []Message{{Role: "user", Content: "hi"}}, forever, nil)),
			"Model.GenerateText": second(m.GenerateText(ctx, "hi", forever)),
			"Model.Chat":         second(m.Chat(ctx, []Message{{Role: "user", Content: "hi"}}, forever)),
			"GenerateText":       second(s.GenerateText(ctx, "hi", forever, nil)),
			"Close":              m.Close(), // idempotent
		} {
			if what == "Close" {
				if err != nil {
					t.Errorf("second Close: %v", err)
				}
				continue
			}
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close: %v, want ErrClosed", what, err)
			}
		}
		s.Truncate(2) // forgets tokens; the closed model's caches are left alone
		if s.Len() != 2 {
			t.Errorf("Truncate after Close: %d tokens", s.Len())
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		m, err := Load(dir, Options{Device: device})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		started := make(chan struct{}, 4)
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() {
				s, err := m.NewSession(0)
				if err != nil {
					errs[i] = err
					return
				}
				_, errs[i] = s.Generate(ctx, prompt, forever, func(tok Token) error {
					if tok.Index == 0 {
						started <- struct{}{}
					}
					return nil
				})
			})
		}
		<-started
		var closers sync.WaitGroup
		for range 3 {
			closers.Go(func() {
				if err := m.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
		}
		closers.Wait()
		wg.Wait()
		for i, err := range errs {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("session %d: %v, want ErrClosed", i, err)
			}
		}
		if !m.released() {
			t.Error("weights not released")
		}
	})
}

func second[T any](_ T, err error) error { return err }

// streamErr drains seq and returns its last error.
func streamErr(seq iter.Seq2[Token, error]) error {
	var last error
	for _, err := range seq {
		if err != nil {
			last = err
		}
	}
	return last
}
