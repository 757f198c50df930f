package engine

import (
	"context"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// BenchmarkDecode measures batch-1 decode on the CPU backend for a Llama-shape
// model with random weights (12 layers, hidden 1024, FFN 2816, 16 heads, 4 KV
// heads, vocab 32000), after a 32-token prompt. It reports tokens/s and the
// weight bytes streamed per second (every weight but the embedding table is
// read once per token).
func BenchmarkDecode(b *testing.B) {
	for _, dt := range []weights.DType{weights.F32, weights.BF16} {
		b.Run(dt.String(), func(b *testing.B) {
			spec := testmodel.Llama{Layers: 12, Hidden: 1024, FFN: 2816, Heads: 16, KVHeads: 4, Vocab: 32000, DType: dt, Seed: 1}
			_, s := openSession(b, testmodel.WriteTemp(b, spec), Options{ContextLength: 2048})
			prompt := make([]int, 32)
			for i := range prompt {
				prompt[i] = i + 2
			}
			ctx := context.Background()
			if _, err := s.Append(ctx, prompt); err != nil {
				b.Fatal(err)
			}
			tok := 7
			b.ResetTimer()
			for b.Loop() {
				if s.Len() == s.ContextLength() {
					s.Truncate(len(prompt))
				}
				if _, err := s.Append(ctx, []int{tok}); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(float64(spec.WeightBytes())/sec/1e9, "weight-GB/s")
		})
	}
}

// BenchmarkFirstNaN is the host picker's check of a step's logits, over a
// 151936-token vocabulary (Qwen3's), against BenchmarkDecode's step times.
func BenchmarkFirstNaN(b *testing.B) {
	logits := make([]float32, 151936)
	for b.Loop() {
		if firstNaN(logits) >= 0 {
			b.Fatal("NaN")
		}
	}
}
