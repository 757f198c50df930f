package model

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// htreeRun is what a model produced over a golden fixture: the prefill
// logits of every position, the logits of the same positions decoded one
// token at a time after a prefill of half of them, and a greedy continuation.
type htreeRun struct {
	full, inc []float32
	greedy    []int32
}

func runForQuality(t *testing.T, m Model, ids []int32, prompt, steps int) htreeRun {
	t.Helper()
	ctx := context.Background()
	T := len(ids)
	var r htreeRun
	st, err := m.NewState(T + steps)
	if err != nil {
		t.Fatal(err)
	}
	if r.full, err = m.Forward(ctx, st, ids, true); err != nil {
		t.Fatal(err)
	}
	st.Truncate(0)
	P := T / 2
	first, err := m.Forward(ctx, st, ids[:P], false)
	if err != nil {
		t.Fatal(err)
	}
	r.inc = append(r.inc, first...)
	for _, id := range ids[P:] {
		lg, err := m.Forward(ctx, st, []int32{id}, false)
		if err != nil {
			t.Fatal(err)
		}
		r.inc = append(r.inc, lg...)
	}
	st.Truncate(0)
	lg, err := m.Forward(ctx, st, ids[:prompt], false)
	if err != nil {
		t.Fatal(err)
	}
	for range steps {
		tok := argmax(lg)
		r.greedy = append(r.greedy, tok)
		if lg, err = m.Forward(ctx, st, []int32{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestHTreeQuality runs the golden llama and qwen3 models with htree (rate
// 4, at most 8 top-level candidates, so a 96-token fixture uses three
// levels) as top-K grows, against the same models with dense attention: it
// logs the logit error, the share of positions whose argmax agrees, the
// greedy tokens that agree (in all and before the first difference), and asserts that htree is exact (logits within
// 1e-4, same greedy tokens) when top-K covers every candidate, and that
// htree decoding equals htree prefill at every top-K.
func TestHTreeQuality(t *testing.T) {
	root := golden.Dir(t)
	for _, arch := range []string{"llama", "qwen3"} {
		dir := filepath.Join(root, arch)
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			continue
		}
		t.Run(arch, func(t *testing.T) {
			ref := golden.Load(t, dir)
			ids, V := ref.InputIDs, ref.Vocab
			T := len(ids)
			prompt, steps := min(20, T), 24
			dense := runForQuality(t, loadTestModel(t, dir), ids, prompt, steps)
			var table strings.Builder
			fmt.Fprintf(&table, "%s, T=%d, rate 4, 8 top-level candidates\n%6s %12s %12s %14s %14s %14s\n",
				arch, T, "top-K", "max|Δlogit|", "mean|Δlogit|", "argmax agree", "greedy agree", "greedy prefix")
			for _, k := range []int{1, 2, 4, 8, 16, 32, T} {
				m, err := openWith(t, dir, AttentionOptions{Kind: "htree", HTree: htree.Options{Rate: 4, TopK: k, TopCandidates: 8}})
				if err != nil && strings.Contains(err.Error(), "sliding window") {
					t.Skip(err)
				} else if err != nil {
					t.Fatal(err)
				}
				got := runForQuality(t, m, ids, prompt, steps)
				var sum float64
				agree := 0
				for p := range T {
					row, want := got.full[p*V:(p+1)*V], dense.full[p*V:(p+1)*V]
					for i := range row {
						sum += math.Abs(float64(row[i] - want[i]))
					}
					if argmax(row) == argmax(want) {
						agree++
					}
				}
				same, prefix := 0, 0
				for i, tok := range got.greedy {
					if tok == dense.greedy[i] {
						same++
						if prefix == i {
							prefix++
						}
					}
				}
				maxErr := maxAbsDiff(got.full, dense.full)
				fmt.Fprintf(&table, "%6d %12.3g %12.3g %9d/%-4d %9d/%-4d %9d/%-4d\n", k, maxErr, sum/float64(T*V), agree, T, same, steps, prefix, steps)
				if d := maxAbsDiff(got.inc, got.full[(T/2-1)*V:]); d > 1e-4 {
					t.Errorf("top-K %d: htree decoding differs from htree prefill by %.3g", k, d)
				}
				if k >= T && (maxErr > 1e-4 || same != steps) {
					t.Errorf("top-K %d covers every candidate, yet max |Δlogit| = %.3g and %d/%d greedy tokens agree", k, maxErr, same, steps)
				}
			}
			t.Log("\n" + table.String())
		})
	}
}

// openWith builds the folder dir on the CPU with attention o.
func openWith(t testing.TB, dir string, o AttentionOptions) (Model, error) {
	t.Helper()
	f, m, err := Open(dir, cpu.New(0), Options{Attention: o})
	if err == nil {
		t.Cleanup(func() { f.Close() })
	}
	return m, err
}

func TestAttentionOptionErrors(t *testing.T) {
	dir := golden.Path(t, "llama")
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		t.Skip("no llama fixture")
	}
	layers := loadTestModel(t, dir).Config().NumLayers
	for _, c := range []struct {
		o    AttentionOptions
		want string
	}{
		{AttentionOptions{Kind: "sparse"}, `attention "sparse"`},
		{AttentionOptions{Kind: "htree", HTree: htree.Options{Rate: 1}}, "rate 1"},
		{AttentionOptions{Kind: "htree", FirstLayer: layers}, "first layer"},
		{AttentionOptions{Kind: "htree", FirstLayer: -1}, "first layer"},
	} {
		if _, err := openWith(t, dir, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open with attention %+v = %v, want an error naming %q", c.o, err, c.want)
		}
	}
	m, err := openWith(t, dir, AttentionOptions{Kind: "htree"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.NewState(8)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.(*llamaState).cache.(*htreeKV); !ok {
		t.Errorf("htree state has a %T cache", st.(*llamaState).cache)
	}
	if st, _ = loadTestModel(t, dir).NewState(8); st.(*llamaState).cache.Bytes() == 0 {
		t.Error("dense state has no cache")
	}
}
