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
	dir := testmodel.WriteTemp(t, testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 1})
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

// TestPagedForwardExact: one sequence decoded through a block table gives
// the bits it gives in a KVCache of its own, on the CPU (the same dot
// products in the same order), for block sizes off the prompt's length;
// a second one sharing its prompt's blocks (the last copied on write where
// the prompt fills it) gives the same tokens, logits to float32 rounding.
func TestPagedForwardExact(t *testing.T) {
	dir := testmodel.WriteTemp(t, testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.F32, Seed: 5})
	m := loadTestModel(t, dir)
	prompt := []int32{5, 17, 3, 99, 42, 8, 61, 7, 7, 30, 2}
	want, wantLogits := alone(t, m, prompt, 5)
	for _, bs := range []int{1, 3, 4, 16} {
		pc, err := m.(Pager).NewPagedCache(32, bs)
		if err != nil {
			t.Fatal(err)
		}
		for run := range 2 { // the second shares the first's blocks
			st, _ := pc.NewState(32)
			in := prompt[pc.Share(st, prompt):]
			for j := range want {
				logits, err := m.Forward(context.Background(), st, in, false)
				if err != nil {
					t.Fatal(err)
				}
				// Shared, the prompt's rest runs as fewer rows, whose
				// matmul sums run in another order (llama_batch_test.go).
				tol := []float64{0, 1e-5}[run]
				if d := maxAbsDiff(logits, wantLogits[j]); d > tol || argmax(logits) != want[j] {
					t.Fatalf("blocks of %d, run %d, token %d: logits differ by %g", bs, run, j, d)
				}
				in = []int32{want[j]}
			}
		}
		if st := pc.Stats(); st.SharedTokens == 0 && bs < len(prompt) {
			t.Errorf("blocks of %d: nothing shared", bs)
		}
	}
}
