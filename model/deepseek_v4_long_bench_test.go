package model

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend/cpu"
)

// benchLongV4Spec is a reduced V4 with the released attention geometry
// (window 128, CSA rate 4 with a 512-entry top-k, HCA rate 128, head dim
// 64 here) and small projections, so that the context-dependent work (the
// indexer's scores over every CSA entry, attention over the window, the
// picks and every HCA entry) is what grows.
var benchLongV4Spec = v4Spec{Vocab: 256, Hidden: 64, Layers: 4, Heads: 4, HeadDim: 64, QLora: 32, Partial: 0.25, OGroups: 2, OLora: 16,
	Window: 128, RateCSA: 4, RateHCA: 128, IndexHeads: 4, IndexDim: 32, IndexTopK: 512, HC: 2, HCIters: 5,
	Experts: 4, K: 2, Inter: 32,
	LayerTypes: []string{v4HCA, v4CSA, v4Sliding, v4CSA}, MLPTypes: []string{v4HashMoE, v4MoE, v4MoE, v4MoE}}

// BenchmarkDeepseekV4LongContext prefills a context of each length on the
// CPU backend (timed once: prefill-ms, prefill-tok/s) and then times decode
// steps at that length (ns/op; each step is rolled back, so the context
// stays put). ctx-read-KiB is what a step reads of the context-dependent
// caches: per CSA layer the indexer's keys (entries x index_head_dim) and
// the window and picked rows, per HCA layer the window and every entry,
// per sliding layer the window; cache-MiB is the state's cache memory.
func BenchmarkDeepseekV4LongContext(b *testing.B) {
	s := benchLongV4Spec
	dir := b.TempDir()
	writeV4Checkpoint(b, dir, s, 2)
	m := loadV4On(b, dir, cpu.New(0))
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, L := range []int{1024, 4096, 16384} {
		b.Run(fmt.Sprintf("ctx=%d", L), func(b *testing.B) {
			ids := randTokens(rng, L+1, s.Vocab)
			st, err := m.NewState(L + 1)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := m.Forward(ctx, st, ids[:L], false); err != nil {
				b.Fatal(err)
			}
			prefill := time.Since(start)
			var read float64 // floats a step reads of the context's caches
			for _, kind := range s.LayerTypes {
				switch kind {
				case v4CSA:
					read += float64(L/s.RateCSA*s.IndexDim + (s.Window+s.IndexTopK)*s.HeadDim)
				case v4HCA:
					read += float64((s.Window + L/s.RateHCA) * s.HeadDim)
				default:
					read += float64(s.Window * s.HeadDim)
				}
			}
			b.ResetTimer()
			for range b.N {
				if _, err := m.Forward(ctx, st, ids[L:], false); err != nil {
					b.Fatal(err)
				}
				st.Truncate(L)
			}
			b.StopTimer()
			b.ReportMetric(float64(prefill.Milliseconds()), "prefill-ms")
			b.ReportMetric(float64(L)/prefill.Seconds(), "prefill-tok/s")
			b.ReportMetric(4*read/1024, "ctx-read-KiB")
			b.ReportMetric(float64(st.CacheBytes())/(1<<20), "cache-MiB")
		})
	}
}
