package engine

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/layers"
)

// BenchmarkLongContextDeepseekV4 measures, on the GPU, the time to first
// token (the prefill of a prompt of each context length, in the engine's
// passes) and the batch-1 greedy decode step at that length, of a reduced
// DeepSeek-V4 with the released attention geometry (window 128, CSA rate 4
// with the 64-head, 128-wide indexer keeping 512 entries, HCA rate 128,
// head_dim 512) and small projections and experts, so that the context's
// cost is what the numbers show. Each RESULT line gives the bytes a decode
// step reads of the context's caches (indexer entries, window, picks, HCA
// entries; f32) and of the weights.
//
// MANIFOLD_BENCH_V4_CONTEXTS lists the lengths (default 4096,16384,32768;
// the checkpoint's max_position_embeddings does not bound them). The
// prefill's indexer scores L²/8 query-entry pairs of 64 heads x 128 per CSA
// layer (two here): about 2·10^14 multiply-adds at 32k, 16 times that at
// 128k.
func BenchmarkLongContextDeepseekV4(b *testing.B) {
	skipWithoutGPU(b)
	contexts := []int{4096, 16384, 32768}
	if v := os.Getenv("MANIFOLD_BENCH_V4_CONTEXTS"); v != "" {
		contexts = contexts[:0]
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("MANIFOLD_BENCH_V4_CONTEXTS=%q: want positive integers separated by commas", v)
			}
			contexts = append(contexts, n)
		}
	}
	spec := testmodel.DeepseekV4{Vocab: 4096, Hidden: 1024, Layers: 6, Heads: 16, HeadDim: 512, QLora: 256,
		OGroups: 2, OLora: 256, Experts: 8, TopK: 2, MoEFFN: 256, HashLayers: 1, Seed: 59,
		LayerTypes: []string{testmodel.V4HCA, testmodel.V4HCA, testmodel.V4CSA, testmodel.V4HCA, testmodel.V4CSA, testmodel.V4HCA}}
	dir := b.TempDir()
	if err := spec.Write(dir); err != nil {
		b.Fatal(err)
	}
	maxCtx := 0
	for _, n := range contexts {
		maxCtx = max(maxCtx, n)
	}
	m, err := Load(dir, Options{Device: "cuda", ContextLength: maxCtx + 1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	for _, L := range contexts {
		s, err := m.NewSession(L + 1)
		if err != nil {
			b.Fatal(err)
		}
		ids := benchPrompt(L, spec.Vocab)
		start := time.Now()
		logits, err := s.Append(ctx, ids)
		if err != nil {
			b.Fatal(err)
		}
		ttft := time.Since(start)
		next := layers.Argmax(logits)
		const steps = 32
		var best time.Duration
		for range 3 {
			start := time.Now()
			for range steps {
				s.Truncate(L)
				if _, err := s.Append(ctx, []int{next}); err != nil {
					b.Fatal(err)
				}
			}
			if d := time.Since(start) / steps; best == 0 || d < best {
				best = d
			}
		}
		var read int64 // floats of the context's caches a step reads
		for _, kind := range spec.LayerTypes {
			switch kind {
			case testmodel.V4CSA:
				read += int64(L/4*128 + (128+512)*spec.HeadDim)
			case testmodel.V4HCA:
				read += int64((128 + L/128) * spec.HeadDim)
			}
		}
		fmt.Printf("RESULT longv4 context=%d ttft_s=%.3f prefill_tok_s=%.0f decode_ms=%.3f ctx_read_MB=%.1f weights_MB=%.1f cache_MB=%.1f device=%q\n",
			L, ttft.Seconds(), float64(L)/ttft.Seconds(), best.Seconds()*1e3, 4*float64(read)/1e6, float64(spec.WeightBytes())/1e6,
			float64(s.CacheBytes())/1e6, m.Device())
	}
}
