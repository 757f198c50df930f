package engine

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/model"
)

// Session is one conversation: the tokens seen so far and their KV cache.
type Session struct {
	m      *Model
	st     model.State
	tokens []int
	// noAhead turns off queueing a picked token's run before its id is read
	// back (tests and benchmarks compare the two).
	noAhead bool
	// held is the device word the backend's picks go to (TokenPipeliner),
	// one per session so that every step queues the same work.
	held backend.Buffer
}

// prefillChunk bounds the tokens per forward pass during prefill, so that
// cancellation is noticed and scratch memory stays small.
const prefillChunk = 512

// NewSession opens a session holding up to contextLength positions (0: the
// model's ContextLength).
func (m *Model) NewSession(contextLength int) (*Session, error) {
	if err := m.acquire(); err != nil {
		return nil, err
	}
	defer m.done()
	if contextLength <= 0 {
		contextLength = m.ctxLen
	}
	if err := m.fits(contextLength); err != nil {
		return nil, err
	}
	st, err := m.net.NewState(contextLength)
	if err != nil {
		return nil, fmt.Errorf("engine: new session: %w", err)
	}
	return &Session{m: m, st: st}, nil
}

// fits refuses a context whose caches would take more than the backend's
// memory, where the backend says how much it has: the CPU's physical memory
// (allocating past it would end the process instead of returning an
// error), a GPU's free memory. A model that sizes its states
// (model.StateSizer: DeepSeek-V4's compressed caches and bounded windows)
// is checked by that estimate, others by their per-position cost.
func (m *Model) fits(positions int) error {
	var limit int64
	what := "memory"
	if mem := m.caps.Memory; mem != nil {
		limit = mem.MemoryBytes()
	} else if f, ok := m.backend.(interface{ FreeMemoryBytes() int64 }); ok {
		limit, what = f.FreeMemoryBytes(), "free memory"
	}
	if limit <= 0 {
		return nil // unknown: an allocation that fails returns its own error
	}
	need, per, err := m.stateBytes(positions)
	if err != nil {
		return fmt.Errorf("engine: new session: %w", err)
	}
	if need > limit {
		return fmt.Errorf("engine: new session: a context of %d positions (NewSession's contextLength, else Options.ContextLength) needs %.1f GiB of cache (%d bytes a position), more than the %.1f GiB of %s of %s: ask for fewer positions",
			positions, float64(need)/(1<<30), per, float64(limit)/(1<<30), what, m.Device())
	}
	return nil
}

// stateBytes is the memory a session of positions takes (the model's own
// estimate where it has one, else positions times per) and per, the cost of
// one more position.
func (m *Model) stateBytes(positions int) (need, per int64, err error) {
	if per, err = m.cacheBytesPerToken(); err != nil {
		return 0, 0, err
	}
	if sz, ok := m.net.(model.StateSizer); ok {
		return sz.StateBytes(positions), per, nil
	}
	if per > 0 && int64(positions) > math.MaxInt64/per {
		return math.MaxInt64, per, nil
	}
	return per * int64(positions), per, nil
}

// Len is the number of tokens in the session.
func (s *Session) Len() int { return len(s.tokens) }

// ContextLength is the number of positions the session holds.
func (s *Session) ContextLength() int { return s.st.Cap() }

// Tokens returns a copy of the session's tokens.
func (s *Session) Tokens() []int { return slices.Clone(s.tokens) }

// CacheBytes is the memory the session's caches hold on the device.
func (s *Session) CacheBytes() int64 { return s.st.CacheBytes() }

// CacheBytesPerToken is the cache memory each position costs.
func (s *Session) CacheBytesPerToken() int64 { return s.st.CacheBytesPerToken() }

// Reset forgets every token.
func (s *Session) Reset() { s.Truncate(0) }

// Truncate keeps the first n tokens, so that generation can resume from there.
// After Model.Close it only forgets tokens.
func (s *Session) Truncate(n int) {
	n = max(0, min(n, len(s.tokens)))
	if s.m.acquire() == nil {
		s.st.Truncate(min(n, s.st.Len()))
		s.m.done()
	}
	s.tokens = s.tokens[:n]
}

// Append adds tokens to the session, runs every token not yet run through the
// model, and returns the logits ([vocab]) that predict the next token. On
// error (cancellation and Model.Close included) the session is left as it was.
func (s *Session) Append(ctx context.Context, tokens []int) ([]float32, error) {
	if err := s.m.acquire(); err != nil {
		return nil, err
	}
	defer s.m.done()
	return s.appendHost(ctx, tokens)
}

// appendHost is Append for a caller that holds the model (Model.acquire).
func (s *Session) appendHost(ctx context.Context, tokens []int) ([]float32, error) {
	var logits []float32
	if s.st.Len() > len(s.tokens) { // a run queued ahead (picker) that is not kept
		s.st.Truncate(len(s.tokens))
	}
	err := s.run(ctx, tokens, func(ids []int32) (err error) {
		if s.m.sched != nil {
			logits, err = s.m.sched.forward(ctx, s.st, ids)
		} else {
			logits, err = s.m.net.Forward(ctx, s.st, ids, false)
		}
		return err
	})
	return logits, err
}

// appendDevice is Append leaving the logits on the backend.
func (s *Session) appendDevice(ctx context.Context, tokens []int, df model.DeviceForwarder) (backend.Buffer, error) {
	var logits backend.Buffer
	err := s.run(ctx, tokens, func(ids []int32) (err error) {
		logits, err = df.ForwardDevice(ctx, s.st, ids)
		return err
	})
	return logits, err
}

// run checks tokens, and passes every token not yet run through forward in
// chunks of at most prefillChunk; the last call's result is the caller's.
// Between chunks it stops on ctx's cancellation and on Model.Close. The
// caller holds the model (Model.acquire).
func (s *Session) run(ctx context.Context, tokens []int, forward func(ids []int32) error) error {
	for i, t := range tokens {
		if t < 0 || t >= s.m.cfg.VocabSize {
			return fmt.Errorf("engine: token %d at index %d is outside the vocabulary [0, %d)", t, i, s.m.cfg.VocabSize)
		}
	}
	start := s.st.Len()
	run := append(slices.Clone(s.tokens[start:]), tokens...)
	if len(run) == 0 {
		if start == 0 {
			return fmt.Errorf("engine: append: no tokens")
		}
		// Everything has run: rerun the last token for its logits.
		start--
		s.st.Truncate(start)
		run = s.tokens[start:]
	}
	if free := s.st.Cap() - start; len(run) > free {
		return fmt.Errorf("engine: %d tokens do not fit in the context: %d of %d positions used: %w",
			len(run), start, s.st.Cap(), ErrContextFull)
	}
	ids := make([]int32, len(run))
	for i, t := range run {
		ids[i] = int32(t)
	}
	for lo := 0; lo < len(ids); lo += prefillChunk {
		err := ctx.Err()
		if err == nil {
			err = s.m.closing()
		}
		if err == nil {
			err = forward(ids[lo:min(lo+prefillChunk, len(ids))])
		}
		if err != nil {
			s.st.Truncate(start)
			return err
		}
	}
	s.tokens = append(s.tokens[:start], run...)
	return nil
}
