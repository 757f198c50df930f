package engine

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/model"
)

// TestDeepseekV4MillionPositions opens a session of 1,048,576 positions
// (V4-Flash's max_position_embeddings) on the V4 fixture: the engine checks
// it by V4's own estimate (model.StateSizer: compressed entries, bounded
// windows), the caches take a small fraction of a dense shared-KV cache,
// and the session runs. A context past the machine's memory is an error
// that names the request.
func TestDeepseekV4MillionPositions(t *testing.T) {
	dir := golden.Path(t, "deepseek_v4")
	ref := golden.Load(t, dir)
	m, err := Load(dir, Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, ok := m.net.(model.StateSizer); !ok {
		t.Fatalf("%T does not size its states", m.net)
	}
	const positions = 1 << 20
	s, err := m.NewSession(positions)
	if err != nil {
		t.Fatal(err)
	}
	if s.ContextLength() != positions {
		t.Errorf("ContextLength %d, want %d", s.ContextLength(), positions)
	}
	cfg := m.Config()
	dense := int64(4*cfg.NumLayers*cfg.HeadDim) * positions // one shared key/value row a layer and position
	got, per := s.CacheBytes(), s.CacheBytesPerToken()
	if got > dense/4 || got < per*positions {
		t.Errorf("a %d-position session holds %d bytes of cache: want at least %d (CacheBytesPerToken %d a position) and far below a dense cache's %d",
			positions, got, per*positions, per, dense)
	}
	t.Logf("%d positions: %.1f MiB of cache (%d bytes a position; a dense shared-KV cache: %.1f MiB)", positions, float64(got)/(1<<20), per, float64(dense)/(1<<20))
	res, err := s.Generate(context.Background(), ints(ref.InputIDs), GenerateOptions{MaxTokens: 4, StopTokens: []int{}}, nil)
	if err != nil || len(res.Tokens) != 4 {
		t.Fatalf("generate in a %d-position session: %v, %d tokens", positions, err, len(res.Tokens))
	}
	if mem, ok := m.backend.(interface{ MemoryBytes() int64 }); ok && mem.MemoryBytes() > 0 {
		_, err := m.NewSession(math.MaxInt32)
		if err == nil || !strings.Contains(err.Error(), "contextLength") {
			t.Errorf("a session of 2^31-1 positions: %v, want an error naming contextLength", err)
		}
	}
}
