package model

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/weights"
)

// dsaCounter is the CPU backend recording the most rows x keys one
// indexer call scores (the GPU holds that many scores, and three times as
// much top-k scratch, per call).
type dsaCounter struct {
	*cpu.Backend
	maxScores int64
}

func (c *dsaCounter) IndexerSelect(idx backend.Indices, q, w, keys backend.Buffer, m, nKeys, pos0 int) {
	c.maxScores = max(c.maxScores, int64(m)*int64(nKeys))
	c.Backend.IndexerSelect(idx, q, w, keys, m, nKeys, pos0)
}

// TestDeepseekV32LongPrefillChunks prefills 1536 positions (three passes) of the V3.2
// fixture with one Forward: it runs in passes whose indexer scores stay
// within the bound (never [1536, 1536]), and gives the logits of the same
// passes made by the caller.
func TestDeepseekV32LongPrefillChunks(t *testing.T) {
	if testing.Short() {
		t.Skip("long context: a few seconds")
	}
	dir := golden.Path(t, "deepseek_v32")
	const T = 1536
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids := randTokens(rand.New(rand.NewPCG(32, 32)), T, cfg.VocabSize)
	ctx := context.Background()
	run := func(chunk int, budget int64) []float32 {
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer ck.Close()
		b := &dsaCounter{Backend: cpu.New(0)}
		mm, err := Build(b, &Folder{Dir: dir, Config: cfg, Checkpoint: ck}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		m := mm.(*DeepseekV32)
		st, err := m.NewState(T)
		if err != nil {
			t.Fatal(err)
		}
		var out []float32
		if chunk == 0 { // one call: Forward's own passes
			if out, err = m.Forward(ctx, st, ids, true); err != nil {
				t.Fatal(err)
			}
		} else {
			m.maxChunk = T // the caller's passes, each run whole
			for p := 0; p < T; p += chunk {
				o, err := m.Forward(ctx, st, ids[p:min(T, p+chunk)], true)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, o...)
			}
		}
		if b.maxScores > budget {
			t.Errorf("chunk %d: an indexer call scored %d rows x keys, more than %d", chunk, b.maxScores, budget)
		}
		return out
	}
	got := run(0, int64(chunkMax)*T)
	want := run(chunkMax, int64(chunkMax)*T)
	if len(got) != T*cfg.VocabSize {
		t.Fatalf("%d logits, want %d", len(got), T*cfg.VocabSize)
	}
	if d := maxAbsDiff(got, want); d > 1e-6 {
		t.Errorf("one Forward vs the caller's %d-row passes: max |diff| %.3g", chunkMax, d)
	}
}
