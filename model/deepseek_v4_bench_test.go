package model

import (
	"context"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers/mhc"
)

// mhcTimer is the CPU backend with the time spent in its mHC ops recorded
// (the model reaches them through the backend.HyperConnectionOps type assertion, so every
// hyper-connection step, its projection matmul included, is counted).
type mhcTimer struct {
	*cpu.Backend
	spent time.Duration
}

func (b *mhcTimer) MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, eps float32) {
	t := time.Now()
	b.Backend.MHCProject(logits, x, fn, rows, eps)
	b.spent += time.Since(t)
}

func (b *mhcTimer) MHCActivate(m *mhc.Mixer, pre, post, res, logits, base, scale backend.Buffer, rows int) {
	t := time.Now()
	b.Backend.MHCActivate(m, pre, post, res, logits, base, scale, rows)
	b.spent += time.Since(t)
}

func (b *mhcTimer) MHCPre(dst, x, pre backend.Buffer, rows, n, hidden int) {
	t := time.Now()
	b.Backend.MHCPre(dst, x, pre, rows, n, hidden)
	b.spent += time.Since(t)
}

func (b *mhcTimer) MHCPost(dst, x, out, post, res backend.Buffer, rows, n, hidden int) {
	t := time.Now()
	b.Backend.MHCPost(dst, x, out, post, res, rows, n, hidden)
	b.spent += time.Since(t)
}

func (b *mhcTimer) MHCHeadActivate(pre, base backend.Buffer, scale, eps float32, rows, n int) {
	t := time.Now()
	b.Backend.MHCHeadActivate(pre, base, scale, eps, rows, n)
	b.spent += time.Since(t)
}

func (b *mhcTimer) MHCExpand(dst, emb backend.Buffer, rows, n, hidden int) {
	t := time.Now()
	b.Backend.MHCExpand(dst, emb, rows, n, hidden)
	b.spent += time.Since(t)
}

// benchV4Decode prefills prompt tokens, then times one decode token per
// iteration, reporting the share of time in mHC and the cache growth.
func benchV4Decode(b *testing.B, dir string, prompt int) {
	cfg, ck := openFolder(b, dir)
	be := &mhcTimer{Backend: cpu.New(0)}
	m, err := loadDeepseekV4(be, cfg, NewLoader(be, ck))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ids := make([]int32, prompt)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % cfg.VocabSize)
	}
	st, err := m.NewState(prompt + b.N)
	if err != nil {
		b.Fatal(err)
	}
	logits, err := m.Forward(ctx, st, ids, false)
	if err != nil {
		b.Fatal(err)
	}
	be.spent = 0
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if logits, err = m.Forward(ctx, st, []int32{argmax(logits)}, false); err != nil {
			b.Fatal(err)
		}
	}
	total := time.Since(start)
	b.StopTimer()
	b.ReportMetric(100*float64(be.spent)/float64(total), "%mhc")
	b.ReportMetric(float64(st.CacheBytesPerToken()), "cacheB/token")
	b.ReportMetric(float64(b.N)/total.Seconds(), "tok/s")
}

// BenchmarkDeepseekV4Decode is the CPU time per decode token of the golden
// DeepSeek-V4 fixture and of a larger V4-shape model (hidden 1024, 8
// layers of every kind, 16 experts, hc_mult 4) generated here, after a
// 512-token prompt so every compressor has emitted entries.
//
//	go test ./model -run '^$' -bench DeepseekV4Decode -benchtime 64x
func BenchmarkDeepseekV4Decode(b *testing.B) {
	b.Run("golden", func(b *testing.B) {
		dir := golden.Path(b, "deepseek_v4")
		benchV4Decode(b, dir, 64)
	})
	large, written := b.TempDir(), false // the parent's: kept across the sub-benchmark's runs
	b.Run("large", func(b *testing.B) {
		if !written {
			writeV4Checkpoint(b, large, v4Large, 1)
			written = true
		}
		benchV4Decode(b, large, 512)
	})
}

// v4Large is a V4-shape model big enough that the matmuls, not the call
// overhead, dominate: hidden 1024, 16 heads of 128 (rope 32), q_lora 384,
// 4 output groups of 256, window 128, CSA rate 4 with a 64-wide indexer
// (16 heads of 64, top-64), HCA rate 64, hc_mult 4, 16 experts of 512 (top 4).
var v4Large = v4Spec{
	Vocab: 8192, Hidden: 1024, Layers: 8, Heads: 16, HeadDim: 128, QLora: 384, Partial: 0.25,
	OGroups: 4, OLora: 256, Window: 128, RateCSA: 4, RateHCA: 64,
	IndexHeads: 16, IndexDim: 64, IndexTopK: 64, HC: 4, HCIters: 20,
	Experts: 16, K: 4, Inter: 512, Yarn: true,
	LayerTypes: []string{v4HCA, v4HCA, v4CSA, v4HCA, v4CSA, v4Sliding, v4CSA, v4HCA},
	MLPTypes:   []string{v4HashMoE, v4HashMoE, v4HashMoE, v4MoE, v4MoE, v4MoE, v4MoE, v4MoE},
}
