package engine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
)

// BenchmarkDecodeDeepseekV4 measures batch-1 greedy decode of a
// DeepSeek-V4-shape model with random NVFP4 linears on the GPU, after a
// 1024-token prompt (so every CSA and HCA compressor holds entries), against
// the memory floor (the weight bytes a step reads over the copy bandwidth),
// launched op by op (the default) and as CUDA graphs, with and without
// programmatic dependent launch, and prints
// the share of device time per kernel.
//
// The shape is DeepSeek-V4-Flash's (transformers' DeepseekV4Config defaults:
// 43 layers, hidden 4096, 64 heads of 512, q_lora 1024, 8 output groups of
// 1024, window 128, CSA rate 4 and HCA rate 128 alternating, indexer of 64
// heads of 128 keeping 512, hc_mult 4, vocab 129280, top-6 routing over
// experts of 2048 plus a shared expert, 3 hash-routed layers) with 32 routed
// experts per layer instead of 256, so that the checkpoint (25 GB) fits the
// GPU and the device machine's disk. The expert count does not change the
// bytes a step reads beyond the router's (testmodel.DeepseekV4.WeightBytes):
// 8.33 GB a token. MANIFOLD_BENCH_V4_EXPERTS sets another count.
//
// A step runs on the device path (model.DeviceForwarder, the token picked
// on the GPU) when the model has one, else as Session.Generate does:
// Session.Append, the logits read back, greedy on the host. The RESULT
// line's path= says which.
//
// MANIFOLD_BENCH_DIR may name a folder to write the checkpoint into (kept
// and reused while its config.json matches the shape).
func BenchmarkDecodeDeepseekV4(b *testing.B) {
	skipWithoutGPU(b)
	spec, dir := v4BenchCheckpoint(b)
	const prompt, tokens = 1024, 128
	loadStart := time.Now()
	m, err := Load(dir, Options{Device: "cuda", ContextLength: 2048})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.Logf("loaded on %s in %s", m.Device(), time.Since(loadStart))
	s, err := m.NewSession(0)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	first := benchPrefill(b, s, prompt)
	gb := m.Backend().(*kernels.Backend)
	df, onDevice := m.net.(model.DeviceForwarder)
	path := "host"
	if onDevice {
		path = "device"
	}
	// A greedy generation step: the forward pass and the pick, the picked
	// token fed to the next step.
	next := first
	step := func() {
		if onDevice {
			logits, err := s.appendDevice(ctx, []int{next}, df)
			if err != nil {
				b.Fatal(err)
			}
			if next, err = gb.SampleToken(logits, 0, 0, 0); err != nil {
				b.Fatal(err)
			}
			return
		}
		logits, err := s.Append(ctx, []int{next})
		if err != nil {
			b.Fatal(err)
		}
		next = layers.Argmax(logits)
	}
	measure := func() time.Duration { // from the same prompt each time (the first warm-up step replays it)
		s.Truncate(prompt)
		next = first
		return timeSteps(step, tokens)
	}
	timeDecode(b, gb, "decodev4", spec.WeightBytes(),
		fmt.Sprintf(" path=%s layers=%d experts=%d top_k=6 context=%d", path, m.Config().NumLayers, spec.Experts, prompt), measure)

	if onDevice {
		benchGenerate(b, s, gb, "decodev4", prompt, tokens)
	}

	// Per-kernel device time (kernels launched one by one while profiling),
	// and its share of the wall time: the rest is the host (routing between
	// the router's matmul and the experts', launches) and idle device.
	const profiled = 8
	gb.StartProfile()
	start := time.Now()
	for range profiled {
		step()
	}
	wall := time.Since(start)
	prof := gb.StopProfile()
	var dev time.Duration
	for _, k := range prof {
		dev += k.Total
	}
	fmt.Printf("RESULT decodev4_profile steps=%d wall_ms_per_tok=%.2f kernel_ms_per_tok=%.2f kernel_share_of_wall=%.3f\n",
		profiled, wall.Seconds()*1e3/profiled, dev.Seconds()*1e3/profiled, dev.Seconds()/wall.Seconds())
	fmt.Print(kernels.FormatProfile(prof))
}

// benchPrompt is the V4 benchmarks' prompt: n token ids spread over [0,
// vocab).
func benchPrompt(n, vocab int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = (i*7919 + 13) % vocab
	}
	return ids
}

// benchPrefill appends a benchmark prompt of n tokens to s and returns the
// greedy pick after it.
func benchPrefill(b *testing.B, s *Session, n int) int {
	logits, err := s.Append(context.Background(), benchPrompt(n, s.m.Config().VocabSize))
	if err != nil {
		b.Fatal(err)
	}
	return layers.Argmax(logits)
}

// v4BenchCheckpoint writes (or finds in MANIFOLD_BENCH_DIR) the random
// DeepSeek-V4-shape checkpoint the V4 benchmarks load: 32 routed experts a
// layer, or MANIFOLD_BENCH_V4_EXPERTS.
func v4BenchCheckpoint(b *testing.B) (testmodel.DeepseekV4, string) {
	spec := testmodel.DeepseekV4{Experts: 32, Seed: 1}
	if v := os.Getenv("MANIFOLD_BENCH_V4_EXPERTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 6 {
			b.Fatalf("MANIFOLD_BENCH_V4_EXPERTS=%q: want an integer of at least 6 (the top-k)", v)
		}
		spec.Experts = n
	}
	dir := os.Getenv("MANIFOLD_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	want, err := spec.Config()
	if err != nil {
		b.Fatal(err)
	}
	if have, err := os.ReadFile(filepath.Join(dir, "config.json")); err != nil || !bytes.Equal(have, want) {
		start := time.Now()
		if err := spec.Write(dir); err != nil {
			b.Fatal(err)
		}
		b.Logf("wrote the random checkpoint (%.1f GB) in %s", float64(spec.CheckpointBytes())/1e9, time.Since(start))
	}
	return spec, dir
}
