package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa"
)

// TestDSAOps holds each backend.SparseMLAOps method of the CPU backend to the reference
// function it implements, for prefill blocks and single decoding queries,
// on one thread and on several.
func TestDSAOps(t *testing.T) {
	s := layers.MLAShape{Heads: 6, QLoraRank: 8, KVLoraRank: 40, NopeDim: 16, RopeDim: 8, VDim: 12}
	ix := dsa.IndexerShape{Heads: 5, HeadDim: 24, RopeDim: 8, TopK: 7}
	const L = 30
	for _, threads := range []int{1, 3} {
		for _, tc := range []struct{ m, pos0 int }{{L, 0}, {1, L - 1}, {4, L - 4}} {
			t.Run(fmt.Sprintf("threads=%d/m=%d", threads, tc.m), func(t *testing.T) {
				testDSAOps(t, New(threads), s, ix, L, tc.m, tc.pos0)
			})
		}
	}
}

func testDSAOps(t *testing.T, b *Backend, s layers.MLAShape, ix dsa.IndexerShape, L, m, pos0 int) {
	rng := rand.New(rand.NewPCG(uint64(m), uint64(b.threads)))
	buf := func(v []float32) backend.Buffer { x := b.NewBuffer(len(v)); b.Write(x, 0, v); return x }

	// Indexer selection.
	q := randn(rng, m*ix.Heads*ix.HeadDim)
	w := randn(rng, m*ix.Heads)
	keys := randn(rng, L*ix.HeadDim)
	idx, err := b.NewIndices(ix)
	if err != nil {
		t.Fatal(err)
	}
	b.IndexerSelect(idx, buf(q), buf(slices.Clone(w)), buf(keys), m, L, pos0)
	ref, _ := dsa.NewIndexer(ix, 1)
	var want dsa.Selection
	ws := slices.Clone(w)
	dsa.PrepareWeights(ws, ix)
	ref.Select(&want, q, ws, keys, m, L, func(i int) int { return pos0 + i + 1 })
	sel := &idx.(*dsaIndices).sel
	if idx.Rows() != m {
		t.Fatalf("Rows %d, want %d", idx.Rows(), m)
	}
	for i := range m {
		if !slices.Equal(sel.Row(i), want.Row(i)) {
			t.Fatalf("query %d selects %v, reference %v", i, sel.Row(i), want.Row(i))
		}
	}

	// Sparse attention, naive and latent, over that selection.
	per := s.NopeDim + s.VDim
	kvB := randn(rng, s.Heads*per*s.KVLoraRank)
	kvW, err := b.Upload(&backend.HostWeight{Name: "kv_b", Rows: s.Heads * per, Cols: s.KVLoraRank, Format: backend.F32, Data: f32Bytes(kvB)})
	if err != nil {
		t.Fatal(err)
	}
	bb, kvBR := bf16Bytes(kvB)
	kvWB, err := b.Upload(&backend.HostWeight{Name: "kv_b bf16", Rows: s.Heads * per, Cols: s.KVLoraRank, Format: backend.BF16, Data: bb})
	if err != nil {
		t.Fatal(err)
	}
	qm := randn(rng, m*s.Heads*s.QKDim())
	lat := randn(rng, L*s.KVLoraRank)
	rope := randn(rng, L*s.RopeDim)
	kv := make([]float32, L*s.Heads*per)
	for tk := range L {
		for r := range s.Heads * per {
			var d float32
			for j := range s.KVLoraRank {
				d += kvB[r*s.KVLoraRank+j] * lat[tk*s.KVLoraRank+j]
			}
			kv[tk*s.Heads*per+r] = d
		}
	}
	const scale = 0.3
	out := b.NewBuffer(m * s.Heads * s.VDim)
	b.SparseMLAAttention(out, buf(qm), buf(kv), buf(rope), idx, m, s, scale)
	wantOut := make([]float32, m*s.Heads*s.VDim)
	for i := range m {
		dsa.AttendMLA(wantOut[i*s.Heads*s.VDim:], qm[i*s.Heads*s.QKDim():], kv, rope, want.Row(i), s, scale, make([]float32, L))
	}
	if d := maxDiff(out.(Buffer), wantOut); d > 1e-4 {
		t.Fatalf("SparseMLAAttention: max diff %g", d)
	}

	for _, tw := range []struct {
		name string
		w    backend.Weight
		ref  []float32
	}{{"f32", kvW, kvB}, {"bf16", kvWB, kvBR}} {
		qLat := b.NewBuffer(m * s.Heads * s.KVLoraRank)
		b.MLAAbsorbQuery(qLat, buf(qm), tw.w, m, s)
		wantQL := make([]float32, m*s.Heads*s.KVLoraRank)
		for i := range m {
			layers.MLAAbsorbQuery(wantQL[i*s.Heads*s.KVLoraRank:], qm[i*s.Heads*s.QKDim():], s.QKDim(), tw.ref, s)
		}
		if d := maxDiff(qLat.(Buffer), wantQL); d > 1e-4 {
			t.Fatalf("%s MLAAbsorbQuery: max diff %g", tw.name, d)
		}
		oLat := b.NewBuffer(m * s.Heads * s.KVLoraRank)
		b.SparseLatentAttention(oLat, qLat, buf(qm), buf(lat), buf(rope), idx, m, s, scale)
		wantOL := make([]float32, m*s.Heads*s.KVLoraRank)
		for i := range m {
			qr := make([]float32, s.Heads*s.RopeDim)
			for h := range s.Heads {
				copy(qr[h*s.RopeDim:], qm[(i*s.Heads+h)*s.QKDim()+s.NopeDim:(i*s.Heads+h+1)*s.QKDim()])
			}
			dsa.AttendLatent(wantOL[i*s.Heads*s.KVLoraRank:], wantQL[i*s.Heads*s.KVLoraRank:], qr, lat, rope, want.Row(i),
				s.Heads, s.KVLoraRank, s.RopeDim, s.KVLoraRank, s.RopeDim, scale, make([]float32, s.Heads*L))
		}
		if d := maxDiff(oLat.(Buffer), wantOL); d > 1e-4 {
			t.Fatalf("%s SparseLatentAttention: max diff %g", tw.name, d)
		}
		o := b.NewBuffer(m * s.Heads * s.VDim)
		b.MLAExpandOutput(o, oLat, tw.w, m, s)
		wantO := make([]float32, m*s.Heads*s.VDim)
		for i := range m {
			layers.MLAExpandOutput(wantO[i*s.Heads*s.VDim:], wantOL[i*s.Heads*s.KVLoraRank:], tw.ref, s)
		}
		if d := maxDiff(o.(Buffer), wantO); d > 1e-4 {
			t.Fatalf("%s MLAExpandOutput: max diff %g", tw.name, d)
		}
		if tw.name == "f32" {
			// Absorbed equals naive on the same selection.
			if d := maxDiff(o.(Buffer), wantOut); d > 1e-4 {
				t.Fatalf("absorbed vs naive: max diff %g", d)
			}
		}
	}
}

func TestDSALayerNormGatherScatter(t *testing.T) {
	b := New(2)
	rng := rand.New(rand.NewPCG(9, 9))
	x := randn(rng, 3*8)
	w, bias := randn(rng, 8), randn(rng, 8)
	dst := b.NewBuffer(len(x))
	xb := b.NewBuffer(len(x))
	b.Write(xb, 0, x)
	wb, bb := b.NewBuffer(8), b.NewBuffer(8)
	b.Write(wb, 0, w)
	b.Write(bb, 0, bias)
	b.LayerNorm(dst, xb, wb, bb, 1e-6)
	want := make([]float32, len(x))
	layers.LayerNorm(want, x, w, bias, 1e-6)
	if d := maxDiff(dst.(Buffer), want); d != 0 {
		t.Fatalf("layer norm diff %g", d)
	}

	src := b.NewBuffer(4 * 3)
	b.Write(src, 0, []float32{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3})
	g := b.NewBuffer(2 * 3)
	b.GatherRows(g, src, []int32{3, 1}, 3)
	if !slices.Equal(g.(Buffer), Buffer{3, 3, 3, 1, 1, 1}) {
		t.Fatalf("gather %v", g)
	}
	b.ScatterAddRows(src, g, []int32{0, 2}, []float32{2, -1}, 3)
	if !slices.Equal(src.(Buffer), Buffer{6, 6, 6, 1, 1, 1, 1, 1, 1, 3, 3, 3}) {
		t.Fatalf("scatter-add %v", src)
	}
}

func TestAxpy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 9))
	for _, n := range []int{0, 1, 7, 8, 31, 32, 33, 100, 512} {
		x, y := randn(rng, n), randn(rng, n)
		want := slices.Clone(y)
		axpyF32Go(want, x, 0.75)
		axpyF32(y, x, 0.75)
		for i := range y {
			if math.Abs(float64(y[i]-want[i])) > 1e-6 {
				t.Fatalf("n=%d: y[%d] = %v, want %v", n, i, y[i], want[i])
			}
		}
	}
}

// BenchmarkDSADecodeAttention times one decoding query's sparse attention in
// one layer at DeepSeek-V3.2's full size (128 heads, latent 512, nope 128,
// rope 64, v 128, 2048 selected of 4096 cached tokens): on the naive path
// over expanded per-head K/V, and on the absorbed path over the latent
// (query absorption and output expansion by a bf16 kv_b_proj included).
//
//	go test ./backend/cpu -run '^$' -bench DSADecodeAttention -benchtime 20x
func BenchmarkDSADecodeAttention(b *testing.B) {
	s := layers.MLAShape{Heads: 128, QLoraRank: 1536, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128}
	ix := dsa.IndexerShape{Heads: 1, HeadDim: 1, RopeDim: 0, TopK: 2048}
	const L = 4096
	be := New(0)
	rng := rand.New(rand.NewPCG(1, 1))
	fill := func(n int) backend.Buffer { x := be.NewBuffer(n); be.Write(x, 0, randn(rng, n)); return x }
	// A selection of every other token.
	idx, _ := be.NewIndices(ix)
	sel := &idx.(*dsaIndices).sel
	sel.Resize(1, ix.TopK)
	for j := range ix.TopK {
		sel.Idx[j] = int32(2 * j)
	}
	sel.N[0] = int32(ix.TopK)
	q := fill(s.Heads * s.QKDim())
	rope := fill(L * s.RopeDim)
	out := be.NewBuffer(s.Heads * s.VDim)
	per := s.NopeDim + s.VDim
	kvb, _ := bf16Bytes(randn(rng, s.Heads*per*s.KVLoraRank))
	kvW, err := be.Upload(&backend.HostWeight{Name: "kv_b", Rows: s.Heads * per, Cols: s.KVLoraRank, Format: backend.BF16, Data: kvb})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("naive", func(b *testing.B) {
		kv := fill(L * s.Heads * per)
		for b.Loop() {
			be.SparseMLAAttention(out, q, kv, rope, idx, 1, s, 0.1)
		}
		b.ReportMetric(float64(s.Heads*per*4), "cacheB/token")
	})
	b.Run("absorbed", func(b *testing.B) {
		lat := fill(L * s.KVLoraRank)
		qLat, oLat := be.NewBuffer(s.Heads*s.KVLoraRank), be.NewBuffer(s.Heads*s.KVLoraRank)
		for b.Loop() {
			be.MLAAbsorbQuery(qLat, q, kvW, 1, s)
			be.SparseLatentAttention(oLat, qLat, q, lat, rope, idx, 1, s, 0.1)
			be.MLAExpandOutput(out, oLat, kvW, 1, s)
		}
		b.ReportMetric(float64(s.KVLoraRank*4), "cacheB/token")
	})
}
