package engine

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// SamplingOptions choose the next token from the logits, in transformers'
// order: repetition penalty, temperature, top-k, top-p, min-p, then a draw.
type SamplingOptions struct {
	// Temperature divides the logits; 0 means greedy (argmax, first on ties).
	Temperature float64
	// TopK keeps the K most likely tokens (0: off).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches P (0 or 1: off).
	TopP float64
	// MinP drops tokens less likely than MinP times the most likely (0: off).
	MinP float64
	// RepetitionPenalty divides positive logits and multiplies negative ones
	// of every token already in the sequence (0 or 1: off).
	RepetitionPenalty float64
	// Seed seeds the random draws: the same seed, options and model give the
	// same tokens.
	Seed uint64
}

// Sampler draws tokens. It is not safe for concurrent use.
type Sampler struct {
	opts SamplingOptions
	rng  *rand.Rand
	cand []candidate
	seen []bool
}

type candidate struct {
	id    int
	logit float64
}

// Validate reports the first option out of its range, naming it:
// Temperature and RepetitionPenalty must be finite and not negative, TopK
// not negative, TopP and MinP within [0, 1]. Generate checks its options
// with it; a Sampler made from options that fail it draws meaningless tokens.
func (o SamplingOptions) Validate() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(o.Temperature) || o.Temperature < 0:
		return fmt.Errorf("engine: sampling option Temperature %v: want a finite number >= 0 (0: greedy)", o.Temperature)
	case o.TopK < 0:
		return fmt.Errorf("engine: sampling option TopK %d: want >= 0 (0: off)", o.TopK)
	case !(o.TopP >= 0 && o.TopP <= 1):
		return fmt.Errorf("engine: sampling option TopP %v: want a number in [0, 1] (0 or 1: off)", o.TopP)
	case !(o.MinP >= 0 && o.MinP <= 1):
		return fmt.Errorf("engine: sampling option MinP %v: want a number in [0, 1] (0: off)", o.MinP)
	case !finite(o.RepetitionPenalty) || o.RepetitionPenalty < 0:
		return fmt.Errorf("engine: sampling option RepetitionPenalty %v: want a finite number >= 0 (0 or 1: off)", o.RepetitionPenalty)
	}
	return nil
}

// NewSampler returns a sampler for opts, which should pass Validate.
func NewSampler(opts SamplingOptions) *Sampler {
	return &Sampler{opts: opts, rng: rand.New(rand.NewPCG(opts.Seed, 0x6d616e69666f6c64))}
}

// Sample picks the next token from logits (which it may modify) given the
// tokens so far.
func (s *Sampler) Sample(logits []float32, history []int) int {
	c, probs, id := s.dist(logits, history)
	if c == nil {
		return id
	}
	s.cand = c[:0]
	r := s.rng.Float64()
	for i, p := range probs {
		if r < p {
			return c[i].id
		}
		r -= p
	}
	return c[len(c)-1].id
}

// dist is the distribution Sample draws from: the candidates, most likely
// first, and their probabilities; or, when greedy (Temperature 0), nil and
// the token picked.
func (s *Sampler) dist(logits []float32, history []int) ([]candidate, []float64, int) {
	o := s.opts
	if o.RepetitionPenalty > 0 && o.RepetitionPenalty != 1 {
		p := float32(o.RepetitionPenalty)
		if len(s.seen) != len(logits) {
			s.seen = make([]bool, len(logits))
		}
		for _, id := range history { // once per distinct id, as transformers' gather/scatter does
			if id < 0 || id >= len(logits) || s.seen[id] {
				continue
			}
			s.seen[id] = true
			if l := logits[id]; l < 0 {
				logits[id] = l * p
			} else {
				logits[id] = l / p
			}
		}
		for _, id := range history {
			if id >= 0 && id < len(logits) {
				s.seen[id] = false
			}
		}
	}
	if o.Temperature <= 0 {
		return nil, nil, layers.Argmax(logits)
	}
	// Tokens more than e^40 less likely than the best carry no probability a
	// float64 sum can see; dropping them before the sort keeps it short.
	best := float64(logits[layers.Argmax(logits)]) / o.Temperature
	c := s.cand[:0]
	for id, l := range logits {
		if x := float64(l) / o.Temperature; x > best-40 {
			c = append(c, candidate{id, x})
		}
	}
	slices.SortStableFunc(c, func(a, b candidate) int { return cmp.Compare(b.logit, a.logit) })
	if o.TopK > 0 && o.TopK < len(c) {
		kth := c[o.TopK-1].logit
		n := o.TopK
		for n < len(c) && c[n].logit == kth { // ties with the k-th stay, as in transformers
			n++
		}
		c = c[:n]
	}
	probs := softmaxSorted(c)
	if o.TopP > 0 && o.TopP < 1 {
		var cum float64
		n := len(c)
		for i, p := range probs {
			cum += p
			if cum >= o.TopP {
				n = i + 1
				break
			}
		}
		c, probs = c[:n], softmaxSorted(c[:n])
	}
	if o.MinP > 0 {
		floor := o.MinP * probs[0]
		n := 1
		for n < len(c) && probs[n] >= floor {
			n++
		}
		c, probs = c[:n], softmaxSorted(c[:n])
	}
	return c, probs, -1
}

// softmaxSorted returns the probabilities of candidates sorted by falling logit.
func softmaxSorted(c []candidate) []float64 {
	p := make([]float64, len(c))
	var sum float64
	for i, x := range c {
		p[i] = math.Exp(x.logit - c[0].logit)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// onDevice reports whether a backend.TokenSampler can apply these options:
// greedy, or temperature with top-k alone (no repetition penalty, top-p or
// min-p).
func (o SamplingOptions) onDevice() bool {
	plain := (o.RepetitionPenalty == 0 || o.RepetitionPenalty == 1) && (o.TopP <= 0 || o.TopP >= 1) && o.MinP <= 0
	return plain && (o.Temperature <= 0 || (o.TopK >= 1 && o.TopK <= backend.MaxSampleTopK))
}
