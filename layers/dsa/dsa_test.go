package dsa

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/layers"
)

func TestIndexerShapeValidate(t *testing.T) {
	good := IndexerShape{Heads: 4, HeadDim: 32, RopeDim: 16, TopK: 8}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []IndexerShape{
		{Heads: 0, HeadDim: 32, RopeDim: 16, TopK: 8},
		{Heads: 4, HeadDim: 0, RopeDim: 0, TopK: 8},
		{Heads: 4, HeadDim: 32, RopeDim: 33, TopK: 8},
		{Heads: 4, HeadDim: 32, RopeDim: 15, TopK: 8},
		{Heads: 4, HeadDim: 32, RopeDim: 16, TopK: 0},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v: no error", bad)
		}
		if _, err := NewIndexer(bad, 1); err == nil {
			t.Errorf("NewIndexer(%+v): no error", bad)
		}
	}
}

// indexerInputs draws an indexer's queries and head weights for rows query
// tokens and its keys for nKeys tokens, uniform in [-1, 1).
func indexerInputs(rng *rand.Rand, s IndexerShape, rows, nKeys int) (q, w, keys []float32) {
	q = testnum.Uniform(rng, rows*s.Heads*s.HeadDim, 1)
	w = testnum.Uniform(rng, rows*s.Heads, 1)
	return q, w, testnum.Uniform(rng, nKeys*s.HeadDim, 1)
}

// TestScore checks the index score against the reference formula
// Σ_h w_h·ReLU(q_h·k·D^-1/2) with w already scaled by H^-1/2, in float64.
func TestScore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	s := IndexerShape{Heads: 8, HeadDim: 16, RopeDim: 8, TopK: 4}
	const n = 37
	q, w, keys := indexerInputs(rng, s, 1, n)
	ws := slices.Clone(w)
	PrepareWeights(ws, s)
	got := make([]float32, n)
	Score(got, q, ws, keys, n, s, s.ScoreScale())
	want := make([]float32, n)
	for tk := range n {
		var acc float64
		for h := range s.Heads {
			var dot float64
			for i := range s.HeadDim {
				dot += float64(q[h*s.HeadDim+i]) * float64(keys[tk*s.HeadDim+i])
			}
			dot /= math.Sqrt(float64(s.HeadDim))
			acc += float64(w[h]) / math.Sqrt(float64(s.Heads)) * max(dot, 0)
		}
		want[tk] = float32(acc)
	}
	if d := testnum.MaxAbsDiff(got, want); d > 1e-5 {
		t.Fatalf("max diff %g", d)
	}
}

// TestPrepare checks queries and keys against layers' rotary embedding and
// layer norm: half-split RoPE on the leading RopeDim channels only.
func TestPrepare(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	s := IndexerShape{Heads: 3, HeadDim: 12, RopeDim: 8, TopK: 4}
	rope, err := layers.NewRoPE(layers.RoPEParams{Type: "yarn", Theta: 10000, Factor: 8, OriginalMaxPositions: 64, Mscale: 1, MscaleAllDim: 0.5}, s.RopeDim)
	if err != nil {
		t.Fatal(err)
	}
	const rows, pos0 = 5, 3
	half := s.RopeDim / 2
	cos := make([]float32, rows*half)
	sin := make([]float32, rows*half)
	for r := range rows {
		layers.RoPEAngles(cos[r*half:(r+1)*half], sin[r*half:(r+1)*half], pos0+r, rope, false)
	}

	q := testnum.Uniform(rng, rows*s.Heads*s.HeadDim, 1)
	want := slices.Clone(q)
	layers.ApplyRoPE(want, rows, s.Heads, s.HeadDim, 0, pos0, rope, false)
	PrepareQueries(q, rows, s, cos, sin)
	if d := testnum.MaxAbsDiff(q, want); d > 1e-6 {
		t.Fatalf("queries: max diff %g", d)
	}

	k := testnum.Uniform(rng, rows*s.HeadDim, 3)
	nw := testnum.Uniform(rng, s.HeadDim, 1)
	nb := testnum.Uniform(rng, s.HeadDim, 1)
	wantK := make([]float32, len(k))
	layers.LayerNorm(wantK, k, nw, nb, 1e-6)
	layers.ApplyRoPE(wantK, rows, 1, s.HeadDim, 0, pos0, rope, false)
	PrepareKeys(k, rows, s, nw, nb, 1e-6, cos, sin)
	if d := testnum.MaxAbsDiff(k, wantK); d > 1e-6 {
		t.Fatalf("keys: max diff %g", d)
	}
	// Channels past RopeDim are only normalized.
	k2 := testnum.Uniform(rng, s.HeadDim, 1)
	n2 := make([]float32, s.HeadDim)
	layers.LayerNorm(n2, k2, nw, nb, 1e-6)
	PrepareKeys(k2, 1, s, nw, nb, 1e-6, cos, sin)
	if d := testnum.MaxAbsDiff(k2[s.RopeDim:], n2[s.RopeDim:]); d != 0 {
		t.Fatalf("pass-through channels changed by %g", d)
	}
}

func TestSelect(t *testing.T) {
	inf := float32(math.Inf(-1))
	for _, tc := range []struct {
		name    string
		row     []float32
		visible int
		topK    int
		want    []int32
	}{
		{"fewer visible than k", []float32{0.5, 0.1, inf, inf, inf}, 2, 3, []int32{0, 1}},
		{"exactly k visible", []float32{0.5, 0.1, 0.7, inf}, 3, 3, []int32{0, 1, 2}},
		{"top k of visible", []float32{0.5, 0.1, 0.7, 0.3, inf, inf}, 4, 2, []int32{0, 2}},
		{"k above row", []float32{0.2, 0.1}, 2, 16, []int32{0, 1}},
		{"negative scores", []float32{-3, -1, -2, inf}, 3, 2, []int32{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := make([]int32, len(tc.row))
			got := Select(dst, tc.row, tc.visible, tc.topK, nil)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestIndexerSelect checks the parallel block selection against scoring and
// selecting each causal row on its own.
func TestIndexerSelect(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	s := IndexerShape{Heads: 4, HeadDim: 8, RopeDim: 4, TopK: 5}
	const rows, nKeys, pos0 = 12, 20, 8
	q, w, keys := indexerInputs(rng, s, rows, nKeys)
	ix, err := NewIndexer(s, 3)
	if err != nil {
		t.Fatal(err)
	}
	var sel Selection
	ix.Select(&sel, q, w, keys, rows, nKeys, func(i int) int { return pos0 + i + 1 })
	for i := range rows {
		row := make([]float32, nKeys)
		v := min(pos0+i+1, nKeys)
		Score(row, q[i*s.Heads*s.HeadDim:], w[i*s.Heads:], keys, v, s, s.ScoreScale())
		for j := v; j < nKeys; j++ {
			row[j] = float32(math.Inf(-1))
		}
		want := Select(make([]int32, nKeys), row, v, s.TopK, nil)
		if got := sel.Row(i); !slices.Equal(got, want) {
			t.Fatalf("row %d: got %v, want %v", i, got, want)
		}
		if len(sel.Row(i)) != min(v, s.TopK) {
			t.Fatalf("row %d: %d keys, want %d", i, len(sel.Row(i)), min(v, s.TopK))
		}
	}
}

// denseMasked is attention of one query over the keys in idx, computed
// as the reference does: all keys scored, the unselected masked to -inf,
// softmax in float64.
func denseMasked(q, keys, values []float32, idx []int32, n, heads, dk, dv int, scale float32) []float32 {
	out := make([]float32, heads*dv)
	sel := make([]bool, n)
	for _, t := range idx {
		sel[t] = true
	}
	for h := range heads {
		sc := make([]float64, n)
		mx := math.Inf(-1)
		for t := range n {
			if !sel[t] {
				sc[t] = math.Inf(-1)
				continue
			}
			var d float64
			for i := range dk {
				d += float64(q[h*dk+i]) * float64(keys[(t*heads+h)*dk+i])
			}
			sc[t] = d * float64(scale)
			mx = max(mx, sc[t])
		}
		var sum float64
		for t := range n {
			sc[t] = math.Exp(sc[t] - mx)
			sum += sc[t]
		}
		for i := range dv {
			var o float64
			for t := range n {
				o += sc[t] / sum * float64(values[(t*heads+h)*dv+i])
			}
			out[h*dv+i] = float32(o)
		}
	}
	return out
}

func TestAttend(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	const n, heads, dk, dv = 30, 3, 12, 8
	q := testnum.Uniform(rng, heads*dk, 1)
	keys := testnum.Uniform(rng, n*heads*dk, 1)
	values := testnum.Uniform(rng, n*heads*dv, 1)
	all := make([]int32, n)
	for i := range all {
		all[i] = int32(i)
	}
	for _, idx := range [][]int32{all, {0}, {2, 5, 7, 29}, {29}} {
		out := make([]float32, heads*dv)
		Attend(out, q, keys, values, idx, heads, dk, dv, heads*dk, heads*dv, 0.3, make([]float32, len(idx)))
		want := denseMasked(q, keys, values, idx, n, heads, dk, dv, 0.3)
		if d := testnum.MaxAbsDiff(out, want); d > 1e-5 {
			t.Errorf("idx %v: max diff %g", idx, d)
		}
	}
}

// TestAttendLatent checks the absorbed path against the naive one on the
// same selection: latent attention with W_UK folded into the query and W_UV
// applied to the output equals attention over the expanded keys and values.
func TestAttendLatent(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	s := layers.MLAShape{Heads: 4, QLoraRank: 8, KVLoraRank: 16, NopeDim: 8, RopeDim: 4, VDim: 6}
	const n = 25
	latent := testnum.Uniform(rng, n*s.KVLoraRank, 1)
	rope := testnum.Uniform(rng, n*s.RopeDim, 1)
	kvB := testnum.Uniform(rng, s.Heads*(s.NopeDim+s.VDim)*s.KVLoraRank, 0.5)
	q := testnum.Uniform(rng, s.Heads*s.QKDim(), 1) // per head: nope then rope
	scale := float32(0.2)

	// Naive: expand keys [n, H, nope+rope] and values [n, H, v].
	kn := make([]float32, n*s.Heads*s.NopeDim)
	vals := make([]float32, n*s.Heads*s.VDim)
	layers.MLAExpandKV(kn, vals, latent, kvB, n, s)
	keys := make([]float32, n*s.Heads*s.QKDim())
	for tk := range n {
		for h := range s.Heads {
			k := keys[(tk*s.Heads+h)*s.QKDim():]
			copy(k, kn[(tk*s.Heads+h)*s.NopeDim:(tk*s.Heads+h+1)*s.NopeDim])
			copy(k[s.NopeDim:], rope[tk*s.RopeDim:(tk+1)*s.RopeDim])
		}
	}
	// kv_b_proj's output as AttendMLA reads it: per token [H, nope+v].
	per := s.NopeDim + s.VDim
	kv := make([]float32, n*s.Heads*per)
	for tk := range n {
		for h := range s.Heads {
			copy(kv[(tk*s.Heads+h)*per:], kn[(tk*s.Heads+h)*s.NopeDim:(tk*s.Heads+h+1)*s.NopeDim])
			copy(kv[(tk*s.Heads+h)*per+s.NopeDim:], vals[(tk*s.Heads+h)*s.VDim:(tk*s.Heads+h+1)*s.VDim])
		}
	}
	// Absorbed: qLat, qRope.
	qLat := make([]float32, s.Heads*s.KVLoraRank)
	layers.MLAAbsorbQuery(qLat, q, s.QKDim(), kvB, s)
	qRope := make([]float32, s.Heads*s.RopeDim)
	for h := range s.Heads {
		copy(qRope[h*s.RopeDim:], q[h*s.QKDim()+s.NopeDim:(h+1)*s.QKDim()])
	}
	for _, idx := range [][]int32{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}, {3, 9, 24}, {7}} {
		want := make([]float32, s.Heads*s.VDim)
		Attend(want, q, keys, vals, idx, s.Heads, s.QKDim(), s.VDim, s.Heads*s.QKDim(), s.Heads*s.VDim, scale, make([]float32, len(idx)))
		outLat := make([]float32, s.Heads*s.KVLoraRank)
		AttendLatent(outLat, qLat, qRope, latent, rope, idx, s.Heads, s.KVLoraRank, s.RopeDim, s.KVLoraRank, s.RopeDim, scale, make([]float32, s.Heads*len(idx)))
		got := make([]float32, s.Heads*s.VDim)
		layers.MLAExpandOutput(got, outLat, kvB, s)
		if d := testnum.MaxAbsDiff(got, want); d > 1e-5 {
			t.Errorf("idx %v: absorbed vs naive max diff %g", idx, d)
		}
		mla := make([]float32, s.Heads*s.VDim)
		AttendMLA(mla, q, kv, rope, idx, s, scale, make([]float32, len(idx)))
		if d := testnum.MaxAbsDiff(mla, want); d > 1e-5 {
			t.Errorf("idx %v: AttendMLA vs expanded max diff %g", idx, d)
		}
	}
}

func TestKeyCache(t *testing.T) {
	if _, err := NewKeyCache(0, 4); err == nil {
		t.Fatal("dim 0 accepted")
	}
	c, err := NewKeyCache(3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Append([]float32{1, 2}); err == nil {
		t.Fatal("partial key accepted")
	}
	if err := c.Append([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9}); err != nil {
		t.Fatal(err)
	}
	if c.Len() != 3 || c.Dim() != 3 || c.BytesPerToken() != 12 || c.Bytes() < 36 {
		t.Fatalf("len %d dim %d bpt %d bytes %d", c.Len(), c.Dim(), c.BytesPerToken(), c.Bytes())
	}
	c.Truncate(1)
	if c.Len() != 1 || !slices.Equal(c.Keys(), []float32{1, 2, 3}) {
		t.Fatalf("after truncate: %v", c.Keys())
	}
	c.Truncate(5)
	if c.Len() != 1 {
		t.Fatal("truncate past the end changed the cache")
	}
}

func BenchmarkIndexerSelectDecode(b *testing.B) {
	// One decode step of a V3.2-shaped indexer (64 heads of 128) over 8192 keys.
	rng := rand.New(rand.NewPCG(6, 6))
	s := IndexerShape{Heads: 64, HeadDim: 128, RopeDim: 64, TopK: 2048}
	const nKeys = 8192
	q, w, keys := indexerInputs(rng, s, 1, nKeys)
	ix, _ := NewIndexer(s, 1)
	var sel Selection
	for b.Loop() {
		ix.Select(&sel, q, w, keys, 1, nKeys, func(int) int { return nKeys })
	}
}
