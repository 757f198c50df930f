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
	per := measure()
	copyBW := gb.CopyBandwidth()
	floor := float64(spec.WeightBytes()) / copyBW
	gb.SetGraphs(false)
	perDirect := measure()
	gb.SetGraphs(true)
	gb.SetPDL(false)
	perNoPDL := measure()
	gb.SetPDL(true)
	b.ReportMetric(1/per.Seconds(), "tok/s")
	b.ReportMetric(floor/per.Seconds(), "of-floor")
	fmt.Printf("RESULT decode8b tok_s=%.1f floor_tok_s=%.1f of_floor=%.3f bytes_per_token=%d copy_GBps=%.0f graph_launches=%d\n",
		1/per.Seconds(), 1/floor, floor/per.Seconds(), spec.WeightBytes(), copyBW/1e9, gb.GraphLaunches())
	fmt.Printf("RESULT decode8b_no_graphs tok_s=%.1f of_floor=%.3f\n", 1/perDirect.Seconds(), floor/perDirect.Seconds())
	fmt.Printf("RESULT decode8b_no_pdl tok_s=%.1f of_floor=%.3f\n", 1/perNoPDL.Seconds(), floor/perNoPDL.Seconds())
	gb.StartProfile()
	for range 8 {
		step()
	}
	fmt.Print(kernels.FormatProfile(gb.StopProfile()))
}
