package engine

import (
	"fmt"
	"testing"

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
