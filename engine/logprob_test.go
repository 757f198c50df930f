package engine

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
)

// TestLogProbs checks Token.LogProb and TopLogProbs against the log-softmax
// of the logits Append returns for the same tokens, whatever the sampling
// options (they are the model's distribution, before them), and that asking
// for them changes no token, also where the picks otherwise stay on the
// device (heldCPU's pipelined path, which must fall back to the host).
func TestLogProbs(t *testing.T) {
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	prompt := ints(ref.InputIDs[:8])
	ctx := context.Background()
	for _, path := range []string{"host", "pipelined"} {
		m, err := Load(dir, Options{Device: "cpu"})
		if err != nil {
			t.Fatal(err)
		}
		if path == "pipelined" {
			onHeldCPU(t, m, model.Options{})
		}
		for _, o := range []SamplingOptions{{}, {Temperature: 0.7, TopK: 30, Seed: 2},
			{Temperature: 1.3, TopP: 0.8, RepetitionPenalty: 1.3, Seed: 9}} {
			opts := GenerateOptions{MaxTokens: 10, StopTokens: []int{}, Sampling: o}
			s, _ := m.NewSession(64)
			plain, err := s.Generate(ctx, prompt, opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, top := range []int{0, 1, 5, MaxTopLogProbs} {
				opts.LogProbs, opts.TopLogProbs = top == 0, top
				s, _ := m.NewSession(64)
				var toks []Token
				res, err := s.Generate(ctx, prompt, opts, func(tok Token) error { toks = append(toks, tok); return nil })
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(res.Tokens, plain.Tokens) {
					t.Errorf("%s %+v top %d: tokens %v with log-probabilities, %v without", path, o, top, res.Tokens, plain.Tokens)
				}
				// The reference: the host's logits for each prefix.
				r, _ := m.NewSession(64)
				logits, err := r.Append(ctx, prompt)
				if err != nil {
					t.Fatal(err)
				}
				for i, tok := range toks {
					want := refLogSoftmax(logits)
					if d := math.Abs(float64(tok.LogProb) - want[tok.ID]); d > 1e-5 {
						t.Errorf("%s %+v token %d (%d): log-prob %v, want %v", path, o, i, tok.ID, tok.LogProb, want[tok.ID])
					}
					if len(tok.TopLogProbs) != top {
						t.Fatalf("%s: %d top log-probs, want %d", path, len(tok.TopLogProbs), top)
					}
					order := make([]int, len(want))
					for j := range order {
						order[j] = j
					}
					slices.SortStableFunc(order, func(a, b int) int {
						if want[a] != want[b] {
							if want[a] > want[b] {
								return -1
							}
							return 1
						}
						return a - b
					})
					for j, e := range tok.TopLogProbs {
						if e.ID != order[j] || math.Abs(float64(e.LogProb)-want[e.ID]) > 1e-5 {
							t.Errorf("%s token %d: top %d is %+v, want %d (%v)", path, i, j, e, order[j], want[order[j]])
						}
					}
					if logits, err = r.Append(ctx, []int{tok.ID}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		m.Close()
	}
	m, _ := loadGolden(t, "llama")
	s, _ := m.NewSession(32)
	for _, n := range []int{-1, MaxTopLogProbs + 1} {
		if _, err := s.Generate(ctx, prompt, GenerateOptions{TopLogProbs: n}, nil); err == nil || s.Len() != 0 {
			t.Errorf("TopLogProbs %d: %v", n, err)
		}
	}
}

// refLogSoftmax is the log-softmax of logits in float64.
func refLogSoftmax(logits []float32) []float64 {
	lse := layers.LogSumExp(logits)
	out := make([]float64, len(logits))
	for i, l := range logits {
		out[i] = float64(l) - lse
	}
	return out
}

func TestLogProbsEdgeCases(t *testing.T) {
	inf := float32(math.Inf(1))
	lp, top := logProbs([]float32{1, inf, 2, inf}, 3, 3)
	if lp != float32(-math.Log(2)) || top[0] != (TokenLogProb{1, lp}) || top[1] != (TokenLogProb{3, lp}) || !math.IsInf(float64(top[2].LogProb), -1) {
		t.Errorf("+Inf logits: %v %v", lp, top)
	}
	ninf := float32(math.Inf(-1))
	if lp, _ := logProbs([]float32{ninf, ninf}, 0, 0); lp != float32(-math.Log(2)) {
		t.Errorf("all -Inf: %v", lp)
	}
	if _, top := logProbs([]float32{3, 1, 3, 2}, 0, 10); len(top) != 4 || top[0].ID != 0 || top[1].ID != 2 || top[2].ID != 3 {
		t.Errorf("top of 4 asked for 10: %v", top)
	}
}

// TestLogProbsGPU: on the GPU, where picks stay on the device unless
// log-probabilities are asked for, the numbers match the CPU's.
func TestLogProbsGPU(t *testing.T) {
	skipWithoutGPU(t)
	dir := golden.Path(t, "llama")
	ref := golden.Load(t, dir)
	var runs [2][]Token
	for i, device := range []string{"cuda", "cpu"} {
		m, err := Load(dir, Options{Device: device})
		if err != nil {
			t.Fatal(err)
		}
		s, _ := m.NewSession(0)
		_, err = s.Generate(context.Background(), ints(ref.InputIDs[:8]), GenerateOptions{MaxTokens: 12, StopTokens: []int{}, TopLogProbs: 5,
			Sampling: SamplingOptions{Temperature: 0.8, TopK: 40, Seed: 7}}, func(tok Token) error { runs[i] = append(runs[i], tok); return nil })
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range runs[0] {
		g, c := runs[0][i], runs[1][i]
		if g.ID != c.ID || math.Abs(float64(g.LogProb-c.LogProb)) > 1e-3 || len(g.TopLogProbs) != 5 {
			t.Errorf("token %d: GPU %+v, CPU %+v", i, g, c)
		}
	}
}
