package kernels

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/model"
)

// v4StepSpec is a DeepSeek-V4 shape for the step tests on the fake driver:
// the benchmark's head and group shapes (64 heads of 512 would only make
// the checkpoint larger; 8 heads of 512 take the same kernels), its window
// and rates, a small vocabulary, hidden size and expert count, and five
// layers: HCA, HCA, HCA, CSA, HCA (transformers' pattern), the first
// hash-routed.
var v4StepSpec = testmodel.DeepseekV4{Vocab: 512, Hidden: 512, Layers: 5, Heads: 8, HeadDim: 512, QLora: 256,
	OGroups: 8, OLora: 128, IndexHeads: 8, IndexDim: 128, Experts: 8, MoEFFN: 256, HashLayers: 1, Seed: 1}

// v4Step is one decode step's work as the fake driver saw it.
type v4Step struct {
	counts fakeCounts
	ops    []op // the step's queue as launched (GraphsOn: held whole)
}

// runV4Steps loads spec on a fake GPU with o, runs a prompt of prompt
// tokens and then steps decode steps as the benchmark's device path does
// (ForwardDevice, the token picked on the device), or with ahead as
// Generate's pipelined path does (ForwardSampled), and returns each step.
func runV4Steps(t *testing.T, spec testmodel.DeepseekV4, o Options, prompt, steps int, ahead bool) []v4Step {
	t.Helper()
	dir := t.TempDir()
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	b, f := newFakeGPU(t, o)
	folder, m, err := model.Open(dir, b, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer folder.Close()
	st, err := m.NewState(prompt + steps + 8)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ids := make([]int32, prompt)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % m.Config().VocabSize)
	}
	if _, err := m.Forward(ctx, st, ids, false); err != nil {
		t.Fatal(err)
	}
	df := m.(model.DeviceForwarder)
	var out []v4Step
	next := int32(1)
	if ahead {
		// As the engine's Generate: each step's token is picked into held
		// and the next step, run on the held id, is queued before the pick
		// is waited for; the device stays busy throughout (GraphsAuto then
		// holds each step's queue whole).
		f.busy = true
		sf := m.(model.SampledForwarder)
		held := b.NewBuffer(1)
		logits, err := df.ForwardDevice(ctx, st, []int32{next})
		if err != nil {
			t.Fatal(err)
		}
		pick, err := b.SampleTokenTo(held, logits, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for range steps {
			f.reset()
			var ops []op
			f.onSend = func() {
				if ops == nil && b.graphs == GraphsOn {
					ops = cloneOps(b.q.ops)
				}
			}
			logits, err := sf.ForwardSampled(ctx, st, held)
			if err != nil {
				t.Fatal(err)
			}
			next, err := b.SampleTokenTo(held, logits, 0, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pick.Wait(); err != nil {
				t.Fatal(err)
			}
			pick = next
			f.onSend = nil
			out = append(out, v4Step{counts: f.snapshot(), ops: ops})
		}
		return out
	}
	for range steps {
		f.reset()
		var held []op
		f.onSend = func() { // inside launchQueued, the queue finalized (qmu held)
			if held == nil && b.graphs == GraphsOn {
				held = cloneOps(b.q.ops)
			}
		}
		logits, err := df.ForwardDevice(ctx, st, []int32{next})
		if err != nil {
			t.Fatal(err)
		}
		id, err := b.SampleToken(logits, 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.onSend = nil
		next = int32(id)
		out = append(out, v4Step{counts: f.snapshot(), ops: held})
	}
	return out
}

func cloneOps(ops []op) []op {
	out := make([]op, len(ops))
	for i, o := range ops {
		out[i] = op{kind: o.kind, name: o.name, fn: o.fn, grid: o.grid, block: o.block, shared: o.shared,
			cluster: o.cluster, clusterX: o.clusterX, params: slices.Clone(o.params), offs: slices.Clone(o.offs)}
	}
	return out
}

// opDiff lists the ops of b that differ from a's at the same place.
func opDiff(a, b []op) []string {
	var d []string
	if len(a) != len(b) {
		d = append(d, fmt.Sprintf("%d ops against %d", len(b), len(a)))
	}
	for i := range min(len(a), len(b)) {
		if a[i].equal(&b[i]) {
			continue
		}
		what := ""
		switch {
		case a[i].fn != b[i].fn:
			what = "kernel " + a[i].name + " -> " + b[i].name
		case a[i].grid != b[i].grid || a[i].shared != b[i].shared:
			what = fmt.Sprintf("shape %v/%d -> %v/%d", a[i].grid, a[i].shared, b[i].grid, b[i].shared)
		default:
			var ps []string
			for j := range min(len(a[i].offs), len(b[i].offs)) {
				lo, hi := int(a[i].offs[j]), len(a[i].params)
				if j+1 < len(a[i].offs) {
					hi = int(a[i].offs[j+1])
				}
				if hi <= len(b[i].params) && !slices.Equal(a[i].params[lo:hi], b[i].params[lo:hi]) {
					ps = append(ps, fmt.Sprint(j))
				}
			}
			what = "params " + strings.Join(ps, ",")
		}
		d = append(d, fmt.Sprintf("op %d %s: %s", i, b[i].name, what))
	}
	return d
}

func formatCounts(c fakeCounts) string {
	var names []string
	for k := range c.byName {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		return c.byName[names[i]] > c.byName[names[j]] || c.byName[names[i]] == c.byName[names[j]] && names[i] < names[j]
	})
	var sb strings.Builder
	for _, n := range names {
		fmt.Fprintf(&sb, " %s=%d", n, c.byName[n])
	}
	return fmt.Sprintf("launches=%d copies=%d memsets=%d allocs=%d frees=%d syncs=%d sends=%d graph_launches=%d captures=%d\n  %s",
		c.launches, c.copies, c.memsets, c.allocs, c.frees, c.syncs, c.sends, c.graphLaunches, c.captures, sb.String())
}

// TestV4DecodeStepQueue runs DeepSeek-V4 decode steps on the fake driver and
// logs what each asks of the driver: launches by kernel, host waits,
// allocations, and (GraphsOn: the step held whole) how its queue differs
// from the step before it. MANIFOLD_V4STEP_LAYERS=43 counts the
// benchmark's layer count (at this test's widths).
func TestV4DecodeStepQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads a small random checkpoint")
	}
	spec := v4StepSpec
	if os.Getenv("MANIFOLD_V4STEP_LAYERS") != "" {
		fmt.Sscan(os.Getenv("MANIFOLD_V4STEP_LAYERS"), &spec.Layers)
	}
	for _, mode := range []GraphMode{GraphsOff, GraphsOn} {
		steps := runV4Steps(t, spec, Options{Graphs: mode}, 300, 9, false)
		base := 0
		for i, s := range steps {
			t.Logf("graphs=%v step %d: %s", mode, i, formatCounts(s.counts))
			if i > 0 && s.ops != nil {
				d := opDiff(steps[i-1].ops, s.ops)
				t.Logf("  %d ops, %d differ from the step before: %s", len(s.ops), len(d), strings.Join(d, "; "))
			}
			if i == 0 {
				continue // the first step allocates the sampler's scratch
			}
			c := s.counts
			// Two host waits a step (the picked id's copy, and SampleToken's
			// Sync after it), no allocation on the device: a step that
			// allocated (the indexer's scores once did) paid cuMemAlloc and a
			// memset a buffer, and a cuMemFree, which waits for the device,
			// once the garbage collector dropped it (not counted here: when
			// that happens is the collector's).
			if c.allocs != 0 || c.memsets != 0 || c.syncs != 2 {
				t.Errorf("graphs=%v step %d: %d allocations, %d memsets, %d host waits; want 0, 0 and 2", mode, i, c.allocs, c.memsets, c.syncs)
			}
			// A step that closes compression windows adds their v4_compress
			// launches and nothing else (v4_compress has known effects, so
			// the fusion pass joins across it as in the other steps).
			n := c.launches - c.byName["v4_compress"]
			if base == 0 {
				base = n
			}
			if n != base {
				t.Errorf("graphs=%v step %d: %d launches besides v4_compress, want %d as in step 1", mode, i, n, base)
			}
		}
	}
}

// BenchmarkV4StepHost times the host's side of a DeepSeek-V4 decode step
// on the fake driver: building the queue (the model's forward pass, the
// fusion pass, the launches' parameters) and the driver calls' Go side,
// with nothing launched; the real driver's launch calls come on top.
func BenchmarkV4StepHost(b *testing.B) {
	for _, mode := range []GraphMode{GraphsOff, GraphsOn} {
		b.Run(mode.String(), func(b *testing.B) {
			dir := b.TempDir()
			if err := v4StepSpec.Write(dir); err != nil {
				b.Fatal(err)
			}
			g, f := newFakeGPU(b, Options{Graphs: mode})
			folder, m, err := model.Open(dir, g, model.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer folder.Close()
			st, err := m.NewState(4096)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			ids := make([]int32, 300)
			for i := range ids {
				ids[i] = int32(i % 500)
			}
			if _, err := m.Forward(ctx, st, ids, false); err != nil {
				b.Fatal(err)
			}
			df := m.(model.DeviceForwarder)
			f.reset()
			b.ResetTimer()
			for i := range b.N {
				if st.Len() >= 4000 {
					st.Truncate(300)
				}
				logits, err := df.ForwardDevice(ctx, st, []int32{int32(i % 500)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := g.SampleToken(logits, 0, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			c := f.snapshot()
			b.ReportMetric(float64(c.launches)/float64(b.N), "launches/step")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(c.launches+c.graphLaunches*0), "ns/launch")
		})
	}
}

// TestV4StepOpList logs a DeepSeek-V4 decode step's launches in order, as
// the fusion pass leaves them (a step's shape at a glance: -v).
func TestV4StepOpList(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads a small random checkpoint")
	}
	steps := runV4Steps(t, v4StepSpec, Options{Graphs: GraphsOn}, 300, 2, false)
	for i, o := range steps[1].ops {
		t.Logf("%3d %-24s grid %v block %d", i, o.name, o.grid, o.block)
	}
}

// TestV4AheadStepQueue runs DeepSeek-V4 decode steps as Generate pipelines
// them (each step queued on the held id of the pick before it, with the
// device busy) on the fake driver: a step waits on the host once, for the
// pick before it, and reads nothing back mid-step (its embedding and the
// hash-routed layer's picks are gathered by the held id on the device);
// it launches what a step on a known id does, plus the copy of the id into
// the state's record (copy_words) and the hashed picks' gather (embed_ids).
func TestV4AheadStepQueue(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads a small random checkpoint")
	}
	known := runV4Steps(t, v4StepSpec, Options{}, 300, 2, false)[1].counts
	for _, mode := range []GraphMode{GraphsAuto, GraphsOff} {
		for i, s := range runV4Steps(t, v4StepSpec, Options{Graphs: mode}, 300, 9, true) {
			c := s.counts
			t.Logf("graphs=%v ahead step %d: %s", mode, i, formatCounts(c))
			if i == 0 {
				continue
			}
			n := c.launches - c.byName["v4_compress"]
			want := known.launches + v4StepSpec.HashLayers + 1 // the hashed picks' embed_ids, the id's copy_words
			if c.syncs != 1 || c.allocs != 0 || c.memsets != 0 || n != want {
				t.Errorf("graphs=%v ahead step %d: %d host waits, %d allocations, %d memsets, %d launches besides v4_compress; want 1, 0, 0, %d",
					mode, i, c.syncs, c.allocs, c.memsets, n, want)
			}
		}
	}
}

// TestV4AheadStepOps compares a pipelined DeepSeek-V4 step's launches with
// a step on a known id, in order: the same, but for the id's copy into the
// state's record first and each hash-routed layer's gather of its picks
// (embed_ids) before its moe_route, so that the fusion pass makes the same
// joins on both paths and they compute the same values.
func TestV4AheadStepOps(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and loads a small random checkpoint")
	}
	known := runV4Steps(t, v4StepSpec, Options{Graphs: GraphsOn}, 300, 2, false)[1].ops
	ahead := runV4Steps(t, v4StepSpec, Options{Graphs: GraphsOn}, 300, 2, true)[1].ops
	shape := func(ops []op) []string {
		var s []string
		for _, o := range ops {
			s = append(s, fmt.Sprintf("%s %v %d %d", o.name, o.grid, o.block, o.shared))
		}
		return s
	}
	a, k := shape(ahead), shape(known)
	if len(a) == 0 || !strings.HasPrefix(a[0], "copy_words ") {
		t.Fatalf("the pipelined step does not start with the id's copy: %v", a[:min(3, len(a))])
	}
	a = a[1:]
	var hashed int
	for i := 0; i < len(a); i++ {
		if strings.HasPrefix(a[i], "embed_ids ") && i+1 < len(a) && strings.HasPrefix(a[i+1], "moe_route ") {
			a = slices.Delete(a, i, i+1)
			hashed++
		}
	}
	if hashed != v4StepSpec.HashLayers || !slices.Equal(a, k) {
		t.Errorf("%d hashed gathers (want %d); the pipelined step's other launches:\n%s\nthe known id's:\n%s",
			hashed, v4StepSpec.HashLayers, strings.Join(a, "\n"), strings.Join(k, "\n"))
	}
}
