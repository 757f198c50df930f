package model

import (
	"context"
	"errors"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// hidden hides a backend's optional op groups, as a backend without them.
type hidden struct{ backend.Backend }

// TestPagedErrors: a backend without PagedAttentionOps gives ErrNoPaging
// (the caller keeps a KVCache a session), and a pool too small for a
// forward pass fails it with ErrNoBlocks, leaving the state as it was.
func TestPagedErrors(t *testing.T) {
	dir := t.TempDir()
	spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 1}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	f, m, err := Open(dir, hidden{cpu.New(1)}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := m.(Pager).NewPagedCache(8, 4); !errors.Is(err, ErrNoPaging) {
		t.Errorf("backend without the group: %v, want ErrNoPaging", err)
	}
	pc, err := loadTestModel(t, dir).(Pager).NewPagedCache(2, 4)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := pc.NewState(16)
	for _, tc := range []struct {
		tokens []int32
		want   error
	}{{[]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, ErrNoBlocks}, {[]int32{1, 2, 3, 4, 5, 6, 7, 8}, nil}, {[]int32{9}, ErrNoBlocks}} {
		n := st.Len()
		_, err := pc.m.Forward(context.Background(), st, tc.tokens, false)
		if !errors.Is(err, tc.want) {
			t.Errorf("%d tokens after %d in 8 positions: %v, want %v", len(tc.tokens), n, err, tc.want)
		}
		if err != nil && st.Len() != n {
			t.Errorf("failed forward left %d positions, want %d", st.Len(), n)
		}
	}
}
