package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/manifoldlm/manifold/model"
)

// Speculative decoding with the model's own multi-token-prediction block
// (DeepSeek-V4's mtp.0, DeepSeek-V3's layer num_hidden_layers: model.Drafter):
// each step drafts k tokens with the block,
// runs the main model once over the next token and the drafts (k+1
// positions, one batched forward pass) and keeps the longest prefix of the
// drafts the main model agrees with, plus the main model's token after it;
// the cache is rolled back past the rejected drafts. Greedy output is the
// main model's alone, token for token. Sampling keeps the main model's
// distribution by speculative sampling (Leviathan et al. 2023, Chen et al.
// 2023): a draft d drawn from the draft distribution q is kept with
// probability min(1, p(d)/q(d)), where p is the main model's; at the first
// rejection the token is drawn from max(0, p-q) normalized instead. p and q
// are the sampler's distributions (repetition penalty, temperature, top-k,
// top-p, min-p applied to each). The random draws differ from those of
// plain sampling, so a seed gives other (equally distributed) tokens.

// SpeculativeOptions configure speculative decoding (Options.Speculative).
type SpeculativeOptions struct {
	// Mode is "auto" (the default), "on" or "off". "on" loads the model's
	// MTP block and drafts with it (a model without one generates as with
	// "off"); "auto" is "off" for now, as no measurement shows it faster
	// yet (docs/DECISIONS.md).
	Mode string
	// Tokens is the number of tokens drafted a step (0: 1), at most
	// model.MaxDraft.
	Tokens int
	// Generate calls that ask for log-probabilities or pass a Constraint,
	// and steps the scheduler batches, run without drafts.
}

func (o SpeculativeOptions) validate() error {
	switch o.Mode {
	case "", "auto", "on", "off":
	default:
		return fmt.Errorf("engine: Options.Speculative.Mode %q: want auto, on or off", o.Mode)
	}
	if o.Tokens < 0 || o.Tokens > model.MaxDraft {
		return fmt.Errorf("engine: Options.Speculative.Tokens %d: want 0 to %d (0: 1)", o.Tokens, model.MaxDraft)
	}
	return nil
}

// on reports whether the options ask for the MTP block.
func (o SpeculativeOptions) on() bool { return o.Mode == "on" }

// tokens is the drafts per step.
func (o SpeculativeOptions) tokens() int { return max(o.Tokens, 1) }

// SpeculativeStats count a model's speculative steps.
type SpeculativeStats struct {
	Steps    int64 // verify passes
	Drafted  int64 // tokens drafted
	Accepted int64 // drafts kept
}

// AcceptanceRate is Accepted/Drafted (0 before any draft).
func (s SpeculativeStats) AcceptanceRate() float64 {
	if s.Drafted == 0 {
		return 0
	}
	return float64(s.Accepted) / float64(s.Drafted)
}

// SpeculativeStats are the counts of the model's speculative steps so far.
func (m *Model) SpeculativeStats() SpeculativeStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.spec
}

// drafter returns the model's drafter when speculative decoding is on and
// the model carries a loaded MTP block.
func (m *Model) drafter() model.Drafter {
	if !m.specOpts.on() {
		return nil
	}
	if d, ok := m.net.(model.Drafter); ok && d.CanDraft() {
		return d
	}
	return nil
}

// specPicker is picker's function for speculative decoding: a prompt (or
// any run of more than one token) runs as host picks it; a single token
// runs with drafts after it, and the tokens a verify pass keeps are
// returned by the following calls, each with the token it follows.
func (s *Session) specPicker(sampler *Sampler, d model.Drafter, host func(ctx context.Context, tokens []int, more bool) (Token, error)) func(ctx context.Context, tokens []int, more bool) (Token, error) {
	k := s.m.specOpts.tokens()
	var (
		queue []int // tokens kept by the last verify pass, not returned yet
		last  = -1  // the token returned last
	)
	vocab := s.m.cfg.VocabSize
	return func(ctx context.Context, tokens []int, more bool) (Token, error) {
		if len(queue) > 0 && len(tokens) == 1 && tokens[0] == last && s.st.Len() > len(s.tokens) {
			// tokens[0] ran in the verify pass: the session takes it.
			s.tokens = append(s.tokens, tokens[0])
			last, queue = queue[0], queue[1:]
			return Token{ID: last}, nil
		}
		queue = nil
		if s.st.Len() > len(s.tokens) {
			s.st.Truncate(len(s.tokens))
		}
		if len(tokens) != 1 || s.st.Len() != len(s.tokens) || !more {
			t, err := host(ctx, tokens, more)
			last = t.ID
			return t, err
		}
		if err := ctx.Err(); err != nil {
			return Token{}, err
		}
		if err := s.m.closing(); err != nil {
			return Token{}, err
		}
		next := tokens[0]
		if next < 0 || next >= vocab {
			return Token{}, fmt.Errorf("engine: token %d is outside the vocabulary [0, %d)", next, vocab)
		}
		// Draft: each token from the block's distribution, as the sampler
		// shapes it, given the tokens before it.
		hist := append(slices.Clone(s.tokens), next)
		var qs [][]float64 // the draft distributions (sampling)
		drafts, err := d.Draft(ctx, s.st, int32(next), k, func(step int, logits []float32) (int32, error) {
			l := slices.Clone(logits)
			if sampler.opts.Temperature <= 0 {
				t := sampler.Sample(l, hist)
				hist = append(hist, t)
				return int32(t), nil
			}
			q := sampler.probs(l, hist)
			qs = append(qs, q)
			t := drawDense(q, sampler.rng.Float64())
			hist = append(hist, t)
			return int32(t), nil
		})
		if err != nil {
			return Token{}, err
		}
		if sampler.opts.Temperature > 0 && len(qs) < len(drafts) {
			return Token{}, fmt.Errorf("engine: the drafter returned %d drafts but picked %d (each draft must come from pick)", len(drafts), len(qs))
		}
		if len(drafts) == 0 {
			t, err := host(ctx, tokens, more)
			last = t.ID
			return t, err
		}
		// Verify: the main model over next and the drafts.
		ids := make([]int32, 0, len(drafts)+1)
		ids = append(ids, int32(next))
		ids = append(ids, drafts...)
		logits, err := s.m.net.Forward(ctx, s.st, ids, true)
		if err != nil {
			return Token{}, err
		}
		base := len(s.tokens)
		s.tokens = append(s.tokens, next)
		hist = slices.Clone(s.tokens)
		var kept []int
		var t int
		for i := 0; ; i++ {
			row := logits[i*vocab : (i+1)*vocab]
			if j := firstNaN(row); j >= 0 {
				s.st.Truncate(base)
				s.tokens = s.tokens[:base]
				return Token{}, fmt.Errorf("engine: logit %d at position %d is NaN (a weight or config value out of range?); no token drawn", j, base+len(kept))
			}
			if i == len(drafts) {
				t = sampler.Sample(row, hist)
				break
			}
			dr := int(drafts[i])
			if sampler.opts.Temperature <= 0 {
				if t = sampler.Sample(row, hist); t != dr {
					break
				}
			} else {
				var ok bool
				if t, ok = sampler.verify(row, hist, qs[i], dr); !ok {
					break
				}
			}
			kept = append(kept, dr)
			hist = append(hist, dr)
		}
		s.st.Truncate(base + 1 + len(kept))
		s.m.mu.Lock()
		s.m.spec.Steps++
		s.m.spec.Drafted += int64(len(drafts))
		s.m.spec.Accepted += int64(len(kept))
		s.m.mu.Unlock()
		queue = append(kept, t)
		last, queue = queue[0], queue[1:]
		return Token{ID: last}, nil
	}
}

// probs is the sampler's distribution over the vocabulary for logits
// (which it may modify) given the tokens so far (Temperature > 0).
func (s *Sampler) probs(logits []float32, history []int) []float64 {
	p := make([]float64, len(logits))
	c, pr, id := s.dist(logits, history)
	if c == nil {
		p[id] = 1
		return p
	}
	for i, x := range c {
		p[x.id] = pr[i]
	}
	s.cand = c[:0]
	return p
}

// verify is speculative sampling's step for the draft token d drawn from
// q: it keeps d with probability min(1, p(d)/q(d)), p the distribution of
// logits; else it draws from max(0, p-q) normalized. It returns the token
// and whether it is d.
func (s *Sampler) verify(logits []float32, history []int, q []float64, d int) (int, bool) {
	p := s.probs(logits, history)
	return speculate(p, q, d, s.rng.Float64, s.rng.Float64)
}

// speculate is verify's rule over the distributions p and q with draws
// from u.
func speculate(p, q []float64, d int, accept, resample func() float64) (int, bool) {
	if q[d] > 0 && accept()*q[d] < p[d] {
		return d, true
	}
	res := make([]float64, len(p))
	var sum float64
	for i := range p {
		if r := p[i] - q[i]; r > 0 {
			res[i] = r
			sum += r
		}
	}
	if sum <= 0 { // p == q up to rounding: p itself
		return drawDense(p, resample()), false
	}
	for i := range res {
		res[i] /= sum
	}
	return drawDense(res, resample()), false
}

// drawDense draws from the distribution p with the uniform draw r.
func drawDense(p []float64, r float64) int {
	lastNZ := 0
	for i, v := range p {
		if v <= 0 {
			continue
		}
		if r < v {
			return i
		}
		r -= v
		lastNZ = i
	}
	return lastNZ
}
