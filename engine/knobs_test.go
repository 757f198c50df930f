package engine

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
)

// TestKnobsKeepGoldenOutputs: no knob that leaves the model's arithmetic
// alone changes what it computes. For each golden fixture, the full
// sequence's logits (one forward pass over its input ids) and a greedy
// generation from its first tokens, with each value of every such knob,
// are bitwise those of the default options on the same device: on the CPU
// the thread count (1, 2 and one per core), on the GPU (skipped without
// one) every combination of CUDA graphs (auto, on, off), programmatic
// dependent launch (on, off) and the launch-ahead count (the default, 1,
// never).
func TestKnobsKeepGoldenOutputs(t *testing.T) {
	root := golden.Dir(t)
	cpuKnobs := []Options{{Threads: 1}, {Threads: 2}}
	var gpuKnobs []Options
	for _, graphs := range []kernels.GraphMode{kernels.GraphsAuto, kernels.GraphsOn, kernels.GraphsOff} {
		for _, noPDL := range []bool{false, true} {
			for _, ahead := range []int{0, 1, -1} {
				if o := (kernels.Options{Graphs: graphs, NoPDL: noPDL, LaunchAhead: ahead}); o != (kernels.Options{}) {
					gpuKnobs = append(gpuKnobs, Options{GPU: o})
				}
			}
		}
	}
	for _, arch := range golden.Models(t) {
		dir := filepath.Join(root, arch)
		ref := golden.Load(t, dir)
		t.Run(arch+"/cpu", func(t *testing.T) {
			knobs := cpuKnobs
			if arch == "deepseek_v4" { // host experts: on the CPU the same kernels, in the same order
				knobs = append(slices.Clip(knobs), Options{Experts: model.ExpertPlacement{Mode: "host"}})
			}
			checkKnobs(t, dir, ref.InputIDs, "cpu", knobs)
		})
		t.Run(arch+"/cuda", func(t *testing.T) {
			skipWithoutGPU(t)
			checkKnobs(t, dir, ref.InputIDs, "cuda", gpuKnobs)
		})
	}
}

// knobTokens is how many tokens checkKnobs generates.
const knobTokens = 12

// checkKnobs runs the model in dir on device with the default options and
// with each of knobs, and requires every run's outputs to be bitwise the
// default's.
func checkKnobs(t *testing.T, dir string, ids []int32, device string, knobs []Options) {
	want := knobOutputs(t, dir, ids, Options{Device: device})
	if len(want.logits) == 0 || len(want.logits)%len(ids) != 0 || len(want.tokens) != knobTokens {
		t.Fatalf("%d logits for %d positions, %d tokens generated", len(want.logits), len(ids), len(want.tokens))
	}
	for _, o := range knobs {
		o.Device = device
		got := knobOutputs(t, dir, ids, o)
		name := fmt.Sprintf("threads %d, GPU %+v", o.Threads, o.GPU)
		for i, v := range got.logits {
			if math.Float32bits(v) != math.Float32bits(want.logits[i]) {
				t.Errorf("%s: logit %d of the full sequence is %v, %v with the default options", name, i, v, want.logits[i])
				break
			}
		}
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: greedy tokens %v, %v with the default options", name, got.tokens, want.tokens)
		}
	}
}

type knobResult struct {
	logits []float32 // [len(ids), vocab]
	tokens []int     // greedy, after the first tokens of ids
}

// knobOutputs loads dir with opts, computes the logits of every position of
// ids in one forward pass, and generates knobTokens greedily after ids'
// first half (the engine's own loop, which on the GPU queues each step
// before the previous pick is read back).
func knobOutputs(t *testing.T, dir string, ids []int32, opts Options) knobResult {
	t.Helper()
	m, err := Load(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	s, err := m.NewSession(0)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.net.Forward(ctx, s.st, ids, true)
	if err != nil {
		t.Fatal(err)
	}
	var r knobResult
	r.logits = slices.Clone(logits)
	g, err := m.NewSession(0)
	if err != nil {
		t.Fatal(err)
	}
	res, err := g.Generate(ctx, ints(ids[:max(1, len(ids)/2)]), GenerateOptions{MaxTokens: knobTokens, StopTokens: []int{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.tokens = res.Tokens
	return r
}
