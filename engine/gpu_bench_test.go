package engine

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// BenchmarkDecodeLlama8B measures batch-1 decode of a Llama-3-8B-shape model
// (32 layers, hidden 4096, FFN 14336, GQA 32/8, vocab 128256) with random
// NVFP4 linears and a bf16 LM head, against the memory floor (bytes read per
// token over the copy bandwidth), launched op by op (the default) and as
// CUDA graphs, with and without programmatic dependent launch, and prints
// the per-kernel device time. A step is a greedy generation step: forward,
// then the token picked on the device. It first times the prefill of a
// 512-token prompt (RESULT prefill8b) and profiles one.
// MANIFOLD_BENCH_DIR may name a folder to write the 5 GB checkpoint into.
func BenchmarkDecodeLlama8B(b *testing.B) {
	benchDecodeLlama(b, "8b", testmodel.Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256,
		DType: weights.BF16, NVFP4: true, Seed: 1})
}

// BenchmarkDecodeLlama1B is the same benchmark at the Llama-3.2-1B shape (16
// layers, hidden 2048, FFN 8192, GQA 32/8 with heads of 64, vocab 128256;
// RESULT lines named 1b): the launch-shape rules chosen on the 8B shape,
// measured where the matmuls are four times smaller.
// MANIFOLD_BENCH_DIR_1B may name a folder for its 1.6 GB checkpoint.
func BenchmarkDecodeLlama1B(b *testing.B) {
	benchDecodeLlama(b, "1b", testmodel.Llama{Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 128256,
		DType: weights.BF16, NVFP4: true, Seed: 1})
}

// benchCheckpoint is the folder of spec's random checkpoint: env's folder
// where set (written there once, kept for later runs), else a temporary one.
func benchCheckpoint(b *testing.B, env string, spec testmodel.Llama) string {
	b.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		dir = b.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(dir + "/model.safetensors"); err != nil {
		start := time.Now()
		if err := spec.Write(dir); err != nil {
			b.Fatal(err)
		}
		b.Logf("wrote the random checkpoint in %s", time.Since(start))
	}
	return dir
}

// benchDecodeLlama runs the decode benchmark on the checkpoint spec
// describes, written once into its folder; tag ends the RESULT names.
func benchDecodeLlama(b *testing.B, tag string, spec testmodel.Llama) {
	skipWithoutGPU(b)
	env := "MANIFOLD_BENCH_DIR"
	if tag != "8b" {
		env += "_" + strings.ToUpper(tag)
	}
	dir := benchCheckpoint(b, env, spec)
	m, s := openSession(b, dir, Options{Device: "cuda", ContextLength: 1024})
	ctx := context.Background()
	gb := m.Backend().(*kernels.Backend)
	// Prefill: a 512-token prompt into an empty session (one chunk, so every
	// matmul runs at m = 512), the last token's logits read back.
	prompt := make([]int, 512)
	for i := range prompt {
		prompt[i] = 1 + i*7%1000
	}
	prefill := func() time.Duration {
		s.Truncate(0)
		start := time.Now()
		if _, err := s.Append(ctx, prompt); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	prefill()
	pre := min(prefill(), prefill(), prefill())
	fmt.Printf("RESULT prefill%s tokens=%d ms=%.2f tok_s=%.0f\n", tag, len(prompt), float64(pre.Microseconds())/1e3, float64(len(prompt))/pre.Seconds())
	gb.StartProfile()
	prefill()
	fmt.Print(kernels.FormatProfile(gb.StopProfile()))
	s.Truncate(0)
	if _, err := s.Append(ctx, []int{1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
		b.Fatal(err)
	}
	df, ok := m.net.(model.DeviceForwarder)
	if !ok {
		b.Fatal("the Llama model does not forward on the device")
	}
	// A greedy generation step: the forward pass, then the token picked on
	// the device, so only its id comes back.
	step := func() {
		if s.Len() >= 900 {
			s.Truncate(8)
		}
		logits, err := s.appendDevice(ctx, []int{42}, df)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := gb.SampleToken(logits, 0, 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	const tokens = 192
	measure := func() time.Duration { // from the same 8-token context each time
		s.Truncate(8)
		return timeSteps(step, tokens)
	}
	timeDecode(b, gb, "decode"+tag, spec.WeightBytes(), "", measure)
	benchGenerate(b, s, gb, "decode"+tag, 8, tokens)
	gb.SetGraphs(kernels.GraphsOff)
	gb.StartProfile()
	for range 8 {
		step()
	}
	fmt.Print(kernels.FormatProfile(gb.StopProfile()))
	// The dev build's attn_decode timeline (MANIFOLD_ATTN_TRACE=1:
	// gpu_bench_dev_test.go).
	attnTraceSteps(b, s, gb, step)
}

// timeSteps runs step 5 times (warm-up), then tokens times, and returns the
// mean time of the latter.
func timeSteps(step func(), tokens int) time.Duration {
	for range 5 {
		step()
	}
	start := time.Now()
	for range tokens {
		step()
	}
	return time.Since(start) / time.Duration(tokens)
}

// benchGenerate times the engine's own loop: Generate, greedy, from the
// session's first `from` tokens, each pick's run queued before its id comes
// back (the default) and not, alternated, under each graph mode (off: op by
// op; on; auto, the default: graphs for the runs queued ahead).
func benchGenerate(b *testing.B, s *Session, gb *kernels.Backend, name string, from, tokens int) {
	gen := func(ahead bool) float64 {
		s.Truncate(from)
		s.noAhead = !ahead
		defer func() { s.noAhead = false }()
		res, err := s.Generate(context.Background(), nil, GenerateOptions{MaxTokens: tokens + 1, StopTokens: []int{}}, nil)
		if err != nil {
			b.Fatal(err)
		}
		return res.DecodeTokensPerSecond()
	}
	for _, mode := range []kernels.GraphMode{kernels.GraphsOff, kernels.GraphsOn, kernels.GraphsAuto} {
		gb.SetGraphs(mode)
		gen(true)
		gen(false)
		a1, s1, a2, s2 := gen(true), gen(false), gen(true), gen(false)
		fmt.Printf("RESULT %s_generate graphs=%v ahead_tok_s=%.1f sequential_tok_s=%.1f ahead_tok_s=%.1f sequential_tok_s=%.1f\n", name, mode, a1, s1, a2, s2)
	}
	gb.SetGraphs(kernels.GraphsAuto)
}

// timeDecode reports a decode benchmark's time per token as the engine runs
// (launched op by op, PDL on), with CUDA graphs and without PDL, each from
// the same context, against the memory floor: the weight bytes a token
// reads over the copy bandwidth measured in the same process. Graphs and
// op-by-op launches measure within a few percent of each other, so they run
// alternated, twice, and the RESULT lines of name (extra ends the first)
// give the second of each and the order.
func timeDecode(b *testing.B, gb *kernels.Backend, name string, bytes int64, extra string, measure func() time.Duration) {
	var g, d [2]time.Duration
	for i := range 2 {
		gb.SetGraphs(kernels.GraphsOn)
		g[i] = measure()
		gb.SetGraphs(kernels.GraphsOff)
		d[i] = measure()
	}
	launches := gb.GraphLaunches()
	copyBW := gb.CopyBandwidth()
	floor := float64(bytes) / copyBW
	gb.SetPDL(false)
	noPDL := measure()
	gb.SetPDL(true)
	b.ReportMetric(1/d[1].Seconds(), "tok/s")
	b.ReportMetric(floor/d[1].Seconds(), "of-floor")
	fmt.Printf("RESULT %s tok_s=%.1f floor_tok_s=%.1f of_floor=%.3f bytes_per_token=%d copy_GBps=%.0f graph_launches=%d%s\n",
		name, 1/d[1].Seconds(), 1/floor, floor/d[1].Seconds(), bytes, copyBW/1e9, launches, extra)
	fmt.Printf("RESULT %s_graphs tok_s=%.1f of_floor=%.3f\n", name, 1/g[1].Seconds(), floor/g[1].Seconds())
	fmt.Printf("RESULT %s_no_pdl tok_s=%.1f of_floor=%.3f\n", name, 1/noPDL.Seconds(), floor/noPDL.Seconds())
	fmt.Printf("RESULT %s_alternated graphs_tok_s=%.1f direct_tok_s=%.1f graphs_tok_s=%.1f direct_tok_s=%.1f\n",
		name, 1/g[0].Seconds(), 1/d[0].Seconds(), 1/g[1].Seconds(), 1/d[1].Seconds())
}
