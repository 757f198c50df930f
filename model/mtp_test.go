package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/weights"
)

// refMTP is the MTP block (MTPBlock of DeepSeek's inference/model.py) over
// T positions: hIn holds the streams the block reads at each ([T, hc,
// hidden]), toks the token after each. It returns the logits of every
// position and the block's output streams.
func refMTP(t *testing.T, dir string, s v4Spec, hIn []float64, toks []int32) ([]float32, []float64) {
	ck := openCheckpoint(t, dir)
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
	cfg, ck := openFolder(t, dir)
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
	for _, c := range [][2]int{{0, 9}, {9, a}} { // two calls: the block catches up over both
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
	got = got[:0]
	rollbackDraft(t, m, st, ids, a, b, pick)
	if r := st.(*v4State).mtp.lastRows; r != 2 {
		t.Errorf("the draft after the rollback ran the block over %d positions, want 2 (a and a+1)", r)
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

// rollbackDraft runs a verify pass over ids[a:b] on st, rolls st back to
// a+2 and drafts one token after ids[a+2] with pick.
func rollbackDraft(t *testing.T, m interface {
	Model
	Drafter
}, st State, ids []int32, a, b int, pick func(step int, logits []float32) (int32, error)) {
	t.Helper()
	ctx := context.Background()
	if _, err := m.Forward(ctx, st, ids[a:b], true); err != nil {
		t.Fatal(err)
	}
	st.Truncate(a + 2)
	if _, err := m.Draft(ctx, st, ids[a+2], 1, pick); err != nil {
		t.Fatal(err)
	}
}

// v3MTPRef computes DeepSeek-V3's MTP block with the model's own decoder:
// a one-layer model whose layer is the block's, whose final norm and head
// are shared_head's and whose embedding rows are the block's inputs
// eh_proj([enorm(embed(token)); hnorm(h)]) (computed here in float64), so
// that feeding it ids 0, 1, ... runs the block over those inputs at
// positions 0, 1, .... h holds the hidden state of each position (rows of
// hidden), toks the token after each. It returns the logits of every row
// and the block's output (the one-layer model's residual) of the last.
func v3MTPRef(t *testing.T, dir string, h [][]float64, toks []int32) ([]float32, []float32) {
	t.Helper()
	cfg, ck := openFolder(t, dir)
	W := refW{t: t, ck: ck}
	D, V, N := cfg.HiddenSize, cfg.VocabSize, cfg.NumLayers
	p := fmt.Sprintf("model.layers.%d.", N)
	emb, eh := W.get("model.embed_tokens.weight"), W.get(p+"eh_proj.weight")
	table := make([]float32, V*D)
	for i, tok := range toks {
		e := refRMS(emb[int(tok)*D:(int(tok)+1)*D], D, W.get(p+"enorm.weight"), 1e-6)
		hn := refRMS(h[i], D, W.get(p+"hnorm.weight"), 1e-6)
		x := refLinear(append(e, hn...), 1, eh, D)
		for c := range x {
			table[i*D+c] = float32(x[c])
		}
	}
	m2 := rewrite(t, dir, map[string]any{"num_hidden_layers": 1, "first_k_dense_replace": 0}, func(_ *weights.Checkpoint, tn *weights.Tensor) []*weights.Tensor {
		if tn.Name == "model.embed_tokens.weight" {
			return []*weights.Tensor{{Name: tn.Name, DType: weights.F32, Shape: []int{V, D}, Data: f32Bytes(table)}}
		}
		rest, ok := strings.CutPrefix(tn.Name, p)
		var to string
		switch {
		case !ok:
			return nil
		case rest == "shared_head.norm.weight":
			to = "model.norm.weight"
		case rest == "shared_head.head.weight":
			to = "lm_head.weight"
		case strings.HasPrefix(rest, "enorm") || strings.HasPrefix(rest, "hnorm") || strings.HasPrefix(rest, "eh_proj") || strings.HasPrefix(rest, "shared_head"):
			return nil
		default:
			to = "model.layers.0." + rest
		}
		return []*weights.Tensor{{Name: to, DType: tn.DType, Shape: tn.Shape, Data: tn.Data}}
	})
	m, ck2 := openFolder(t, m2)
	net, err := Build(cpu.New(0), &Folder{Dir: m2, Config: m, Checkpoint: ck2}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := net.NewState(len(toks))
	ids := make([]int32, len(toks))
	for i := range ids {
		ids[i] = int32(i)
	}
	logits, err := net.Forward(context.Background(), st, ids, true)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, D)
	cpu.New(0).Read(out, st.(*v32State).x, (len(toks)-1)*D)
	return logits, out
}

// v3Hidden is the final hidden state (model.norm of the residual) of each
// position of ids in m, in float64.
func v3Hidden(t *testing.T, m *DeepseekV32, ids []int32) [][]float64 {
	st, _ := m.NewState(len(ids))
	if _, err := m.Forward(context.Background(), st, ids, false); err != nil {
		t.Fatal(err)
	}
	D := m.cfg.HiddenSize
	x := make([]float32, len(ids)*D)
	m.b.Read(x, st.(*v32State).x, 0)
	norm := make([]float32, D)
	m.b.Read(norm, m.Norm, 0)
	nw := make([]float64, D)
	for i, v := range norm {
		nw[i] = float64(v)
	}
	out := make([][]float64, len(ids))
	for i := range out {
		row := make([]float64, D)
		for c := range row {
			row[c] = float64(x[i*D+c])
		}
		out[i] = refRMS(row, D, nw, float64(m.cfg.RMSNormEps))
	}
	return out
}

// TestDeepseekV3MTP checks DeepSeek-V3's MTP drafts against the block run
// as a one-layer model of the same code (v3MTPRef): the first draft from the
// main model's hidden states, a second from the block's own output, and a
// draft after a rollback.
func TestDeepseekV3MTP(t *testing.T) {
	d := testmodel.DeepseekV3{Layers: 2, DenseLayers: 1, Hidden: 64, FFN: 96, Heads: 2, Vocab: 80, QLora: 32, KVLora: 32,
		Nope: 16, Rope: 8, VDim: 16, Experts: 4, Shared: 1, TopK: 2, MoEFFN: 32, Groups: 2, TopKGroups: 1, MTP: true, Seed: 3}
	dir := testmodel.WriteTemp(t, d)
	cfg, ck := openFolder(t, dir)
	net, err := Build(cpu.New(0), &Folder{Dir: dir, Config: cfg, Checkpoint: ck}, Options{MTP: true})
	if err != nil {
		t.Fatal(err)
	}
	m := net.(*DeepseekV32)
	if !m.CanDraft() {
		t.Fatal("the MTP block was not loaded")
	}
	ctx := context.Background()
	const T, a, b, tol = 20, 11, 15, 2e-4
	V := d.Vocab
	ids := randTokens(rand.New(rand.NewPCG(6, 6)), T, V)
	hidden := v3Hidden(t, m, ids)

	st, _ := m.NewState(T)
	if _, err := m.Forward(ctx, st, ids[:a], false); err != nil {
		t.Fatal(err)
	}
	var got [][]float32
	pick := func(step int, logits []float32) (int32, error) {
		got = append(got, append([]float32(nil), logits...))
		return int32(layers.Argmax(logits)), nil
	}
	drafts, err := m.Draft(ctx, st, ids[a], 2, pick)
	if err != nil || len(drafts) != 2 {
		t.Fatalf("drafts %v, err %v", drafts, err)
	}
	want, out := v3MTPRef(t, dir, hidden[:a], ids[1:a+1])
	if dd := maxAbsDiff(got[0], want[(a-1)*V:]); dd > tol {
		t.Errorf("first draft: logits differ from the block run as a model by %.3g", dd)
	}
	own := make([]float64, len(out))
	for i, v := range out {
		own[i] = float64(v)
	}
	want, _ = v3MTPRef(t, dir, append(hidden[:a:a], own), append(slices.Clone(ids[1:a+1]), drafts[0]))
	if dd := maxAbsDiff(got[1], want[a*V:]); dd > tol {
		t.Errorf("second draft: logits differ from the block run as a model by %.3g", dd)
	}

	got = got[:0]
	rollbackDraft(t, m, st, ids, a, b, pick)
	want, _ = v3MTPRef(t, dir, hidden[:a+2], ids[1:a+3])
	if dd := maxAbsDiff(got[0], want[(a+1)*V:]); dd > tol {
		t.Errorf("draft after a rollback: logits differ from the block run as a model by %.3g", dd)
	}
}

// TestV4ReleasedMTP loads the MTP block of DeepSeek-V4 in each released
// format (FP8 projections, MXFP4, NVFP4 or FP8 experts, attn.kv_norm) and
// holds its drafts' logits to those of the same weights dequantized.
func TestV4ReleasedMTP(t *testing.T) {
	for _, format := range []string{testmodel.V4FP8MXFP4, testmodel.V4FP8NVFP4, testmodel.V4FP8Base} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			d := tinyReleasedV4
			d.Released, d.MTP = format, true
			src := t.TempDir()
			if err := d.Write(src); err != nil {
				t.Fatal(err)
			}
			tokens := make([]int32, 19)
			for i := range tokens {
				tokens[i] = int32((i*97 + 3) % d.Vocab)
			}
			var got [2][][]float32
			for i, dir := range []string{dequantizeReleasedMTP(t, src, true), src} {
				f, m, err := Open(dir, cpu.NewWithOptions(cpu.Options{ReferenceNVFP4: true}), Options{MTP: true})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				dr, ok := m.(Drafter)
				if !ok || !dr.CanDraft() {
					t.Fatalf("%s: no MTP block loaded", dir)
				}
				st, _ := m.NewState(len(tokens) + 4)
				if _, err := m.Forward(context.Background(), st, tokens[:len(tokens)-1], false); err != nil {
					t.Fatal(err)
				}
				if _, err := dr.Draft(context.Background(), st, tokens[len(tokens)-1], 2, func(_ int, l []float32) (int32, error) {
					got[i] = append(got[i], slices.Clone(l))
					return int32(layers.Argmax(l)), nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			for step := range got[0] {
				if dd := maxAbsDiff(got[1][step], got[0][step]); dd > 1e-5 || math.IsNaN(dd) {
					t.Errorf("draft step %d: released vs dequantized: max |logit diff| %.3g", step, dd)
				}
			}
		})
	}
}
