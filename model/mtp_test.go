package model

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/weights"
)

// refMTP is the MTP block (MTPBlock of DeepSeek's inference/model.py) over
// T positions: hIn holds the streams the block reads at each ([T, hc,
// hidden]), toks the token after each. It returns the logits of every
// position and the block's output streams.
func refMTP(t *testing.T, dir string, s v4Spec, hIn []float64, toks []int32) ([]float32, []float64) {
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	W := refW{t: t, ck: ck, spec: s}
	T, D, n, eps := len(toks), s.Hidden, s.HC, 1e-6
	emb := W.get("model.embed_tokens.weight")
	e := make([]float64, T*D)
	for i, id := range toks {
		copy(e[i*D:(i+1)*D], emb[int(id)*D:(int(id)+1)*D])
	}
	e = refLinear(refRMS(e, D, W.get("mtp.0.enorm.weight"), eps), T, W.get("mtp.0.e_proj.weight"), D)
	x := refLinear(refRMS(hIn, D, W.get("mtp.0.hnorm.weight"), eps), T*n, W.get("mtp.0.h_proj.weight"), D)
	for i := 0; i < T; i++ {
		for k := 0; k < n; k++ {
			for c := 0; c < D; c++ {
				x[(i*n+k)*D+c] += e[i*D+c]
			}
		}
	}
	x = refV4Layer(W, ck, s, "mtp.0.", v4Sliding, v4MoE, x, toks, 0)
	return refV4Head(W, s, x, T, "mtp.0.hc_head_", "mtp.0.norm.weight"), x
}

func loadV4MTP(t *testing.T, dir string) *DeepseekV4 {
	t.Helper()
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	b := cpu.New(0)
	m, err := loadDeepseekV4With(b, cfg, NewLoader(b, ck), true)
	if err != nil {
		t.Fatal(err)
	}
	if !m.CanDraft() {
		t.Fatal("the MTP block was not loaded")
	}
	return m
}

// TestDeepseekV4MTP checks the MTP block's drafts against the float64
// transcription of the reference: the first draft from the main model's
// streams (caught up over several calls), further drafts from the block's
// own, and the drafts after a rollback of the main model.
func TestDeepseekV4MTP(t *testing.T) {
	spec := v4Specs["hc3"]
	spec.IndexTopK = 64 // every entry: the indexer's choice does not depend on how the tokens were fed
	spec.MTP = true
	dir := t.TempDir()
	writeV4Checkpoint(t, dir, spec, 11)
	m := loadV4MTP(t, dir)
	ctx := context.Background()
	const T, a, b, k = 30, 17, 21, 3
	ids := randTokens(rand.New(rand.NewPCG(5, 5)), T, spec.Vocab)
	_, streams := refV4Run(t, dir, spec, ids, 0)
	D, n, V := spec.Hidden, spec.HC, spec.Vocab
	const tol = 2e-4

	st, err := m.NewState(T)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]int{{0, 9}, {9, a}} { // the first chunk's streams are gone: the block starts at 9
		if _, err := m.Forward(ctx, st, ids[c[0]:c[1]], false); err != nil {
			t.Fatal(err)
		}
	}
	var got [][]float32
	pick := func(step int, logits []float32) (int32, error) {
		got = append(got, append([]float32(nil), logits...))
		return int32(layers.Argmax(logits)), nil
	}
	drafts, err := m.Draft(ctx, st, ids[a], k, pick)
	if err != nil {
		t.Fatal(err)
	}
	if len(drafts) != k {
		t.Fatalf("%d drafts, want %d", len(drafts), k)
	}
	// The reference: positions 9..a-1 from the main streams, then the
	// block's own output for each further step.
	hIn := append([]float64(nil), streams[9*n*D:a*n*D]...)
	toks := append([]int32(nil), ids[10:a+1]...)
	for step := 0; step < k; step++ {
		logits, out := refMTP(t, dir, spec, hIn, toks)
		last := logits[(len(toks)-1)*V:]
		if d := maxAbsDiff(got[step], last); d > tol {
			t.Errorf("draft step %d: logits differ from the reference by %.3g", step, d)
		}
		hIn = append(hIn, out[(len(toks)-1)*n*D:]...)
		toks = append(toks, drafts[step])
	}

	// Drafting again at the same length redoes the last position: the same drafts.
	got = got[:0]
	again, err := m.Draft(ctx, st, ids[a], k, pick)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, drafts) {
		t.Errorf("drafts again at the same length %v, first %v", again, drafts)
	}

	// A verify pass over a..b-1, rolled back to a+2: the next draft
	// catches up over positions a and a+1 from the verify pass's streams.
	if _, err := m.Forward(ctx, st, ids[a:b], true); err != nil {
		t.Fatal(err)
	}
	st.Truncate(a + 2)
	got = got[:0]
	if _, err := m.Draft(ctx, st, ids[a+2], 1, pick); err != nil {
		t.Fatal(err)
	}
	logits, _ := refMTP(t, dir, spec, streams[9*n*D:(a+2)*n*D], ids[10:a+3])
	if d := maxAbsDiff(got[0], logits[(a+2-10)*V:]); d > tol {
		t.Errorf("draft after a rollback: logits differ from the reference by %.3g", d)
	}
	// The main model replays the kept position with the new tokens.
	main, err := m.Forward(ctx, st, ids[a+2:T], true)
	if err != nil {
		t.Fatal(err)
	}
	want := refV4Forward(t, dir, spec, ids, 0)
	if d := maxAbsDiff(main, want[(a+2)*V:]); d > tol {
		t.Errorf("main logits after the rollback differ from the reference by %.3g", d)
	}
}
