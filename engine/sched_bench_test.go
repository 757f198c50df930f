package engine

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// BenchmarkSchedulerStep is BenchmarkSchedulerHost with a real model
// computing, a small one on the CPU: c sessions of a Pool (the paged
// cache, as served) each run a prompt of 8 tokens then decode 64 greedy
// tokens, picked on the host (the CPU's path) or through hostPicks (the
// GPU's path, the picks done on the host).
func BenchmarkSchedulerStep(b *testing.B) {
	for _, picks := range []string{"host", "device"} {
		b.Run("picks="+picks, func(b *testing.B) { benchSchedulerStep(b, picks == "device") })
	}
}

func benchSchedulerStep(b *testing.B, devicePicks bool) {
	spec := testmodel.Llama{Layers: 2, Hidden: 16, FFN: 16, Heads: 2, KVHeads: 1, Vocab: 512, DType: weights.F32, Seed: 3}
	dir := b.TempDir()
	if err := spec.Write(dir); err != nil {
		b.Fatal(err)
	}
	m, err := Load(dir, Options{Device: "cpu", Threads: 1, ContextLength: 512})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	if devicePicks {
		pickOnHostDevice(m, BatchOptions{})
	}
	for _, c := range []int{1, 8, 32, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchSessions(b, m, c, 8, 64) })
	}
}

// hostPicks is the CPU backend with the device-pick op groups
// (backend.TokenSampler, backend.BatchTokenSampler) done on the host, so
// that the scheduler takes the path it takes on the GPU (forwardPick,
// forwardDevice) on the CPU.
type hostPicks struct{ *cpu.Backend }

func (b hostPicks) SampleToken(logits backend.Buffer, temperature float32, topK int, u float64) (int, error) {
	l := make([]float32, logits.Len())
	b.Read(l, logits, 0)
	return cpu.SampleToken(l, temperature, topK, u)
}

func (b hostPicks) SampleTokens(ids []int, logits backend.Buffer, vocab int, picks []backend.SamplePick) error {
	l := make([]float32, vocab)
	for i, p := range picks {
		b.Read(l, logits, p.Row*vocab)
		id, err := cpu.SampleToken(l, p.Temperature, p.TopK, p.U)
		if err != nil {
			return fmt.Errorf("row %d: %w", p.Row, err)
		}
		ids[i] = id
	}
	return nil
}

// pickOnHostDevice makes m (loaded on the CPU) pick its tokens through
// hostPicks, as on a device that picks.
func pickOnHostDevice(m *Model, o BatchOptions) {
	hb := hostPicks{m.backend.(*cpu.Backend)}
	m.caps.Sampler, m.caps.BatchSampler = hb, hb
	m.sched = newScheduler(m.net, o, hb)
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
