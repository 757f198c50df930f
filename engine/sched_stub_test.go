package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/model"
)

// stubNet is a model that computes nothing: its passes only advance the
// states and return zero logits (the token 0 follows every token), so that
// a benchmark of the scheduler measures the host's work alone.
type stubNet struct {
	cfg    *model.Config
	b      backend.Backend
	device time.Duration // a device pass's wait for the device (as for a GPU's step): a sleep
	mu     sync.Mutex
	logits backend.Buffer // [rows, vocab], zero
}

type stubState struct{ n, cap int }

func (s *stubState) Len() int                  { return s.n }
func (s *stubState) Cap() int                  { return s.cap }
func (s *stubState) Truncate(n int)            { s.n = min(s.n, n) }
func (s *stubState) CacheBytes() int64         { return 0 }
func (s *stubState) CacheBytesPerToken() int64 { return 0 }

func (m *stubNet) Config() *model.Config { return m.cfg }
func (m *stubNet) NewState(capacity int) (model.State, error) {
	return &stubState{cap: capacity}, nil
}

func (m *stubNet) run(st model.State, tokens []int32) error {
	s := st.(*stubState)
	if s.n+len(tokens) > s.cap {
		return fmt.Errorf("stub: %d tokens past %d of %d", len(tokens), s.n, s.cap)
	}
	s.n += len(tokens)
	return nil
}

func (m *stubNet) buf(rows int) backend.Buffer {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.logits == nil || m.logits.Len() < rows*m.cfg.VocabSize {
		m.logits = m.b.NewBuffer(rows * m.cfg.VocabSize)
	}
	return m.b.View(m.logits, 0, rows*m.cfg.VocabSize)
}

func (m *stubNet) Forward(_ context.Context, st model.State, tokens []int32, _ bool) ([]float32, error) {
	return make([]float32, m.cfg.VocabSize), m.run(st, tokens)
}

func (m *stubNet) ForwardDevice(_ context.Context, st model.State, tokens []int32) (backend.Buffer, error) {
	time.Sleep(m.device)
	return m.buf(1), m.run(st, tokens)
}

func (m *stubNet) ForwardBatch(_ context.Context, sts []model.State, tokens [][]int32) ([]float32, error) {
	for i, st := range sts {
		if err := m.run(st, tokens[i]); err != nil {
			return nil, err
		}
	}
	return make([]float32, len(sts)*m.cfg.VocabSize), nil
}

func (m *stubNet) ForwardBatchDevice(_ context.Context, sts []model.State, tokens [][]int32) (backend.Buffer, error) {
	time.Sleep(m.device)
	for i, st := range sts {
		if err := m.run(st, tokens[i]); err != nil {
			return nil, err
		}
	}
	return m.buf(len(sts)), nil
}

// zeroPicks picks the token 0 of every row without reading the logits: a
// device whose picks cost the host nothing.
type zeroPicks struct{ *cpu.Backend }

func (zeroPicks) SampleToken(backend.Buffer, float32, int, float64) (int, error) { return 0, nil }
func (zeroPicks) SampleTokens(ids []int, _ backend.Buffer, _ int, _ []backend.SamplePick) error {
	clear(ids)
	return nil
}
