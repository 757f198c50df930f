package engine

import (
	"context"
	"fmt"
	"os"
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
// token over the copy bandwidth), with and without CUDA graphs and
// programmatic dependent launch, and prints
// the per-kernel device time. A step is a greedy generation step: forward,
// then the token picked on the device. It first times the prefill of a
// 512-token prompt (RESULT prefill8b) and profiles one.
// MANIFOLD_BENCH_DIR may name a folder to write the 5 GB checkpoint into.
func BenchmarkDecodeLlama8B(b *testing.B) {
	if !kernels.Available() {
		b.Skip("no CUDA driver or GPU")
	}
	spec := testmodel.Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256,
		DType: weights.BF16, NVFP4: true, Seed: 1}
	dir := os.Getenv("MANIFOLD_BENCH_DIR")
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
	m, err := Load(dir, Options{Device: "cuda", ContextLength: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession(0)
	if err != nil {
		b.Fatal(err)
	}
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
	fmt.Printf("RESULT prefill8b tokens=%d ms=%.2f tok_s=%.0f\n", len(prompt), float64(pre.Microseconds())/1e3, float64(len(prompt))/pre.Seconds())
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
		for range 5 {
			step()
		}
		start := time.Now()
		for range tokens {
			step()
		}
		return time.Since(start) / tokens
	}
	timeDecode(b, gb, spec.WeightBytes(), measure).print("decode8b", "")
	gb.StartProfile()
	for range 8 {
		step()
	}
	fmt.Print(kernels.FormatProfile(gb.StopProfile()))
}

// decodeRun is a decode benchmark's time per token as the engine runs (CUDA
// graphs and PDL on), without graphs and without PDL, each from the same
// context, and the memory floor: the weight bytes a token reads over the
// copy bandwidth measured in the same process.
type decodeRun struct {
	per, direct, noPDL time.Duration
	bytes              int64
	copyBW, floor      float64 // bytes per second, seconds per token
	graphLaunches      int
}

// timeDecode runs measure three ways on gb and reports tok/s and of-floor.
func timeDecode(b *testing.B, gb *kernels.Backend, bytes int64, measure func() time.Duration) decodeRun {
	r := decodeRun{per: measure(), bytes: bytes}
	r.graphLaunches = gb.GraphLaunches()
	r.copyBW = gb.CopyBandwidth()
	r.floor = float64(bytes) / r.copyBW
	gb.SetGraphs(false)
	r.direct = measure()
	gb.SetGraphs(true)
	gb.SetPDL(false)
	r.noPDL = measure()
	gb.SetPDL(true)
	b.ReportMetric(1/r.per.Seconds(), "tok/s")
	b.ReportMetric(r.floor/r.per.Seconds(), "of-floor")
	return r
}

// print writes the RESULT lines of name (extra ends the first).
func (r decodeRun) print(name, extra string) {
	fmt.Printf("RESULT %s tok_s=%.1f floor_tok_s=%.1f of_floor=%.3f bytes_per_token=%d copy_GBps=%.0f graph_launches=%d%s\n",
		name, 1/r.per.Seconds(), 1/r.floor, r.floor/r.per.Seconds(), r.bytes, r.copyBW/1e9, r.graphLaunches, extra)
	fmt.Printf("RESULT %s_no_graphs tok_s=%.1f of_floor=%.3f\n", name, 1/r.direct.Seconds(), r.floor/r.direct.Seconds())
	fmt.Printf("RESULT %s_no_pdl tok_s=%.1f of_floor=%.3f\n", name, 1/r.noPDL.Seconds(), r.floor/r.noPDL.Seconds())
}
