package engine

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/model"
)

// TestHTreeAttention: with its defaults htree is exact below 8192 positions,
// so the golden greedy tokens come out; a small top-K changes them; a bad
// option fails Load with an error naming it.
func TestHTreeAttention(t *testing.T) {
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	greedy := func(o model.AttentionOptions) []int {
		_, s := openSession(t, dir, Options{Device: "cpu", Attention: o})
		res, err := s.Generate(context.Background(), ints(ref.InputIDs[:20]), GenerateOptions{MaxTokens: len(ref.GreedyTokens), StopTokens: []int{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	if got := greedy(model.AttentionOptions{Kind: "htree"}); !slices.Equal(got, ints(ref.GreedyTokens)) {
		t.Errorf("htree with defaults: greedy %v, want %v", got, ref.GreedyTokens)
	}
	if got := greedy(model.AttentionOptions{Kind: "htree", HTree: htree.Options{Rate: 2, TopK: 1, TopCandidates: 2}}); slices.Equal(got, ints(ref.GreedyTokens)) {
		t.Errorf("htree with top-K 1: greedy %v equals dense", got)
	}
	_, err := Load(dir, Options{Device: "cpu", Attention: model.AttentionOptions{Kind: "htree", HTree: htree.Options{TopK: -1}}})
	if err == nil || !strings.Contains(err.Error(), "top-K -1") {
		t.Errorf("Load with top-K -1: %v", err)
	}
}
