package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
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

// BenchmarkSchedulerHost is the host's work a step of the scheduler and
// the sessions around it (issue 60), the model's compute taken out
// (stubNet): c sessions each run a prompt of 8 tokens then decode 64
// greedy tokens, their picks made on a device that costs nothing
// (zeroPicks, the GPU's path: scheduler.forwardPick) or on the host
// (the CPU's path: the logits of every sequence come back); with the
// device's picks, also c prompts of 512 tokens (a step each) then 16
// tokens, and (step=1ms) device passes that wait 1 ms, as a GPU's step
// keeps the host waiting: ns/step less 1 ms is then the time the device
// would stand idle between steps.
func BenchmarkSchedulerHost(b *testing.B) {
	spec := testmodel.Llama{Layers: 1, Hidden: 16, FFN: 16, Heads: 1, KVHeads: 1, Vocab: 128256, DType: weights.F32, Seed: 3}
	dir := b.TempDir()
	if err := spec.Write(dir); err != nil {
		b.Fatal(err)
	}
	for _, picks := range []string{"device", "host", "device/step=1ms"} {
		b.Run("picks="+picks, func(b *testing.B) {
			m, err := Load(dir, Options{Device: "cpu", Threads: 1, ContextLength: 512})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			cb := m.backend.(*cpu.Backend)
			stub := &stubNet{cfg: m.cfg, b: cb}
			if picks == "device/step=1ms" {
				stub.device = time.Millisecond
			}
			m.net = stub
			if picks != "host" {
				zp := zeroPicks{cb}
				m.caps.Sampler, m.caps.BatchSampler = zp, zp
				m.sched = newScheduler(m.net, BatchOptions{}, zp)
			} else {
				m.sched = newScheduler(m.net, BatchOptions{}, cb)
			}
			for _, c := range []int{1, 8, 32, 64} {
				b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchSessions(b, m, c, 8, 64) })
			}
			if picks == "device" { // prompts of a step each (StepTokens)
				for _, c := range []int{8, 32} {
					b.Run(fmt.Sprintf("prompt=512/c=%d", c), func(b *testing.B) { benchSessions(b, m, c, 512, 16) })
				}
			}
		})
	}
}

// benchSessions runs c sessions at once of a pool of m, each a prompt of
// prompt tokens then output greedy tokens, and reports the wall time, the
// allocations and the bytes a step of the scheduler, the mean batch and
// the output tokens/s.
func benchSessions(b *testing.B, m *Model, c, prompt, output int) {
	p, err := m.NewPool(PoolOptions{Sessions: c, ContextLength: prompt + output})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var steps, seqs int64
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	waited0 := m.sched.gatherTimeouts()
	for b.Loop() {
		st0 := m.BatchStats()
		concurrentRate(b, c, output, func(j int) error { return poolRequest(p, testPrompt(j, prompt, m.cfg.VocabSize), output) })
		st1 := m.BatchStats()
		steps += st1.Steps - st0.Steps
		seqs += st1.Sequences - st0.Sequences
	}
	runtime.ReadMemStats(&ms1)
	wall := b.Elapsed()
	if steps > 0 {
		b.ReportMetric(float64(wall.Nanoseconds())/float64(steps), "ns/step")
		b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(steps), "allocs/step")
		b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(steps), "B/step")
		b.ReportMetric(float64(seqs)/float64(steps), "batch")
		b.ReportMetric(float64(m.sched.gatherTimeouts()-waited0)/float64(steps), "timeouts/step")
	}
	b.ReportMetric(float64(c*output*b.N)/wall.Seconds(), "tok/s")
}

// poolRequest is a request of the serving benchmarks: a session of p for
// the prompt ids, output greedy tokens after it, the session released.
func poolRequest(p *Pool, ids []int, output int) error {
	s, n, err := p.Acquire(context.Background(), ids)
	if err != nil {
		return err
	}
	defer p.Release(s)
	_, err = s.Generate(context.Background(), ids[n:], GenerateOptions{MaxTokens: output, StopTokens: []int{}}, nil)
	return err
}

// gatherTimeouts is the gathers that ended at the Gather deadline.
func (s *scheduler) gatherTimeouts() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waited
}
