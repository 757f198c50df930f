package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/model"
)

// TestCancelKeepsStreamedTokens stops Generate after k streamed tokens, by
// cancelling its context and by an error from the stream callback, on the
// host sampling path and on the pipelined one (heldCPU, where the cache
// runs a position ahead of the tokens): afterwards the session holds the
// earlier tokens, the prompt and exactly the result's tokens, and a
// continuation generates what a fresh session given those tokens does.
func TestCancelKeepsStreamedTokens(t *testing.T) {
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	first, prompt := ints(ref.InputIDs[:5]), ints(ref.InputIDs[5:13])
	ctx := context.Background()
	errStop := errors.New("stop")
	for _, path := range []string{"host", "pipelined", "pipelined, not ahead"} {
		m, err := Load(dir, Options{Device: "cpu"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if path != "host" {
			onHeldCPU(t, m, model.Options{})
		}
		for _, o := range []SamplingOptions{{}, {Temperature: 0.9, TopK: 40, Seed: 5}} {
			for _, how := range []string{"context", "callback"} {
				for _, k := range []int{0, 1, 2, 3, 7, 11} {
					if how == "callback" && k == 0 {
						continue // the callback sees a token first
					}
					name := fmt.Sprintf("%s %+v %s k=%d", path, o, how, k)
					s, err := m.NewSession(64)
					if err != nil {
						t.Fatal(err)
					}
					s.noAhead = path == "pipelined, not ahead"
					opts := GenerateOptions{MaxTokens: 30, StopTokens: []int{}, Sampling: o}
					if _, err := s.Generate(ctx, first, opts, nil); err != nil {
						t.Fatal(err)
					}
					before := s.Tokens()
					cctx, cancel := context.WithCancel(ctx)
					if k == 0 {
						cancel()
					}
					var streamed []int
					res, err := s.Generate(cctx, prompt, opts, func(tok Token) error {
						streamed = append(streamed, tok.ID)
						if len(streamed) == k {
							if how == "callback" {
								return errStop
							}
							cancel()
						}
						return nil
					})
					cancel()
					want := map[string]error{"context": context.Canceled, "callback": errStop}[how]
					if !errors.Is(err, want) {
						t.Fatalf("%s: %v, want %v", name, err, want)
					}
					if len(res.Tokens) != k || !slices.Equal(streamed, res.Tokens) {
						t.Errorf("%s: result %v, streamed %v", name, res.Tokens, streamed)
					}
					if got, want := s.Tokens(), slices.Concat(before, prompt, res.Tokens); !slices.Equal(got, want) {
						t.Errorf("%s: session holds %d tokens %v,\nwant %d (%d before, prompt %d, result %d) %v",
							name, len(got), got, len(want), len(before), len(prompt), len(res.Tokens), want)
					}
					if s.st.Len() > s.Len() {
						t.Errorf("%s: the cache holds %d positions, the session %d tokens", name, s.st.Len(), s.Len())
					}
					// The conversation resumes from exactly those tokens.
					greedy := GenerateOptions{MaxTokens: 4, StopTokens: []int{}}
					more, err := s.Generate(ctx, nil, greedy, nil)
					if err != nil {
						t.Fatal(err)
					}
					fresh, _ := m.NewSession(64)
					again, err := fresh.Generate(ctx, s.Tokens()[:s.Len()-len(more.Tokens)], greedy, nil)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(more.Tokens, again.Tokens) {
						t.Errorf("%s: resumed %v, a fresh session over the same tokens %v", name, more.Tokens, again.Tokens)
					}
				}
			}
		}
	}
}
