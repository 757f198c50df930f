package model

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// batchSchedule is a run of ForwardBatch steps over sequences that join
// mid-run: sequence i joins at step join[i] with its prompt (prefilled in
// chunks of at most chunk tokens, one chunk a step) and then decodes
// greedily for steps tokens. It returns each sequence's generated tokens and
// the logits of every step of each, as single-stream Forward would give them.
// With pc set, the sequences are paged in it, each sharing the cached
// blocks of its prompt's prefix as it joins.
func batchSchedule(t *testing.T, m Model, pc *PagedCache, prompts [][]int32, join []int, chunk, steps int) ([][]int32, [][][]float32) {
	t.Helper()
	bf := m.(BatchForwarder)
	vocab := m.Config().VocabSize
	type seq struct {
		st      State
		pending []int32 // tokens not yet run
		out     []int32
		logits  [][]float32
	}
	seqs := make([]*seq, len(prompts))
	for step := 0; ; step++ {
		var sts []State
		var toks [][]int32
		var who []*seq
		done := true
		for i, p := range prompts {
			if step == join[i] {
				newState := m.NewState
				if pc != nil {
					newState = pc.NewState
				}
				st, err := newState(len(p) + steps + 1)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				if pc != nil {
					n = pc.Share(st, p)
				}
				seqs[i] = &seq{st: st, pending: slices.Clone(p[n:])}
			}
			s := seqs[i]
			if s == nil || len(s.out) >= steps {
				done = done && s != nil
				continue
			}
			done = false
			n := min(chunk, len(s.pending))
			sts, toks, who = append(sts, s.st), append(toks, s.pending[:n]), append(who, s)
			s.pending = s.pending[n:]
		}
		if done {
			break
		}
		if len(sts) == 0 {
			continue
		}
		logits, err := bf.ForwardBatch(context.Background(), sts, toks)
		if err != nil {
			t.Fatal(err)
		}
		for j, s := range who {
			if len(s.pending) > 0 {
				continue // mid-prompt: its logits predict nothing asked for
			}
			row := logits[j*vocab : (j+1)*vocab]
			s.logits = append(s.logits, slices.Clone(row))
			s.out = append(s.out, argmax(row))
			s.pending = []int32{argmax(row)}
		}
	}
	out := make([][]int32, len(seqs))
	lg := make([][][]float32, len(seqs))
	for i, s := range seqs {
		out[i], lg[i] = s.out, s.logits
	}
	return out, lg
}

// alone decodes prompt greedily for steps tokens with Forward.
func alone(t *testing.T, m Model, prompt []int32, steps int) ([]int32, [][]float32) {
	t.Helper()
	st, err := m.NewState(len(prompt) + steps + 1)
	if err != nil {
		t.Fatal(err)
	}
	var out []int32
	var lg [][]float32
	in := prompt
	for range steps {
		logits, err := m.Forward(context.Background(), st, in, false)
		if err != nil {
			t.Fatal(err)
		}
		lg = append(lg, logits)
		out = append(out, argmax(logits))
		in = []int32{argmax(logits)}
	}
	return out, lg
}

// TestForwardBatchMatchesAlone holds ForwardBatch to single-stream Forward:
// sequences of different lengths, joining mid-run, prefilled in chunks
// mixed with the others' decode steps, two of them sharing a prefix, give
// the same greedy tokens, and (f32 and bf16 on the CPU) the same logits to
// float32 rounding: the CPU multiplies several rows in tiles whose sums
// run in another order than one row's (backend/cpu/gemm.go). The batch runs
// with a KVCache a sequence, then paged (blocks of 4 and of 3 positions):
// sequences joining after another with the same prompt prefix share its
// blocks, and one whose prompt is another's whole copies its last block on
// write.
func TestForwardBatchMatchesAlone(t *testing.T) {
	cases := []struct {
		name  string
		spec  testmodel.Llama
		exact bool
		dir   string // a golden fixture instead of spec
	}{
		{name: "llama-f32", spec: testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.F32, Seed: 7}, exact: true},
		{name: "qwen3-bf16", spec: testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.BF16, Qwen3: true, Seed: 8}, exact: true},
		{name: "llama-nvfp4", spec: testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.BF16, NVFP4: true, Seed: 9}},
		{name: "golden-llama", dir: "llama", exact: true},
		{name: "golden-qwen3", dir: "qwen3", exact: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.dir != "" {
				dir = filepath.Join(golden.Dir(t), tc.dir)
			} else if err := tc.spec.Write(dir); err != nil {
				t.Fatal(err)
			}
			m := loadTestModel(t, dir)
			vocab := int32(m.Config().VocabSize)
			prompt := func(seed, n int) []int32 {
				p := make([]int32, n)
				for i := range p {
					p[i] = int32((seed*31 + i*17 + 3) % int(vocab))
				}
				return p
			}
			shared := prompt(1, 9)
			prompts := [][]int32{prompt(2, 5), prompt(3, 1), shared, append(slices.Clone(shared), prompt(4, 6)...), prompt(5, 13), shared}
			join := []int{0, 0, 1, 3, 4, 6}
			const steps = 6
			want := make([][]int32, len(prompts))
			wantLogits := make([][][]float32, len(prompts))
			for i, p := range prompts {
				want[i], wantLogits[i] = alone(t, m, p, steps)
			}
			for _, bs := range []int{0, 4, 3} {
				var pc *PagedCache
				if bs > 0 {
					var err error
					if pc, err = m.(Pager).NewPagedCache(64, bs); err != nil {
						t.Fatal(err)
					}
				}
				got, gotLogits := batchSchedule(t, m, pc, prompts, join, 4, steps)
				if pc != nil {
					if st := pc.Stats(); st.SharedTokens == 0 || bs == 3 && st.Copies == 0 {
						t.Errorf("blocks of %d: %d positions shared, %d blocks copied on write", bs, st.SharedTokens, st.Copies)
					}
				}
				for i, p := range prompts {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("blocks of %d: sequence %d (%d prompt tokens, joins at step %d): batched %v, alone %v", bs, i, len(p), join[i], got[i], want[i])
					}
					if !tc.exact {
						continue
					}
					for j := range wantLogits[i] {
						if d := maxAbsDiff(gotLogits[i][j], wantLogits[i][j]); d > 1e-5 {
							t.Errorf("blocks of %d: sequence %d token %d: logits differ from single-stream by up to %g", bs, i, j, d)
						}
					}
				}
			}
		})
	}
}

// TestForwardBatchErrors: bad batches are refused before anything runs.
func TestForwardBatchErrors(t *testing.T) {
	dir := t.TempDir()
	spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 1}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	m := loadTestModel(t, dir)
	bf := m.(BatchForwarder)
	a, _ := m.NewState(4)
	b, _ := m.NewState(4)
	for _, tc := range []struct {
		name string
		sts  []State
		toks [][]int32
	}{
		{"empty", nil, nil},
		{"mismatch", []State{a}, [][]int32{{1}, {2}}},
		{"twice", []State{a, a}, [][]int32{{1}, {2}}},
		{"vocab", []State{a, b}, [][]int32{{1}, {40}}},
		{"full", []State{a, b}, [][]int32{{1}, {1, 2, 3, 4, 5}}},
		{"no tokens", []State{a, b}, [][]int32{{1}, {}}},
	} {
		if _, err := bf.ForwardBatch(context.Background(), tc.sts, tc.toks); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
		if a.Len() != 0 || b.Len() != 0 {
			t.Fatalf("%s: states ran: %d, %d", tc.name, a.Len(), b.Len())
		}
	}
}
