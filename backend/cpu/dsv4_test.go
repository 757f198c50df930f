package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
)

// TestV4CompressSplit checks that splitting the entries over threads (each
// sub-range taking its predecessor window along) gives exactly the
// single-call reference.
func TestV4CompressSplit(t *testing.T) {
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 1e4, PartialRotaryFactor: 0.5}, 8)
	if err != nil {
		t.Fatal(err)
	}
	rope.Interleaved = true
	for _, a := range []dsv4.CompressArgs{
		{Entries: 37, Rate: 2, Width: 8, Overlap: true, Prev: true, Pos0: 6, Eps: 1e-6, RoPE: rope},
		{Entries: 41, Rate: 3, Width: 8, Overlap: true, Eps: 1e-6, RoPE: rope},
		{Entries: 29, Rate: 4, Width: 8, Eps: 1e-6, RoPE: rope},
	} {
		rng := rand.New(rand.NewPCG(1, uint64(a.Entries)))
		rw := a.RowWidth()
		kv, gate := randn(rng, a.SourceRows()*rw), randn(rng, a.SourceRows()*rw)
		ape, norm := randn(rng, a.Rate*rw), randn(rng, a.Width)
		want := make([]float32, a.Entries*a.Width)
		dsv4.Compress(want, kv, gate, ape, norm, a)
		for _, threads := range []int{1, 2, 5} {
			got := make(Buffer, len(want))
			New(threads).CompressKV(got, Buffer(kv), Buffer(gate), Buffer(ape), Buffer(norm), a)
			if !slices.Equal([]float32(got), want) {
				t.Errorf("%+v on %d threads differs from the reference", a, threads)
			}
		}
	}
}

func TestV4AttentionAndIndexSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	ia := dsv4.IndexArgs{M: 9, Heads: 2, Dim: 4, Entries: 7, TopK: 3, Pos0: 20, Rate: 4, Scale: 0.5}
	q, keys, w := randn(rng, ia.M*ia.Heads*ia.Dim), randn(rng, ia.Entries*ia.Dim), randn(rng, ia.M*ia.Heads)
	want := make([]float32, ia.M*ia.TopK)
	dsv4.IndexTopK(want, q, keys, w, make([]float32, ia.Entries), ia)
	got := make(Buffer, len(want))
	New(3).CompressedIndexTopK(got, Buffer(q), Buffer(keys), Buffer(w), ia)
	if !slices.Equal([]float32(got), want) {
		t.Errorf("CompressedIndexTopK = %v, want %v", got, want)
	}

	aa := dsv4.AttnArgs{M: 9, Heads: 2, Dim: 4, Pos0: 20, Lo: 15, Window: 6, Rate: 4, TopK: 3, Entries: 7, Scale: 0.5}
	qa, local, sinks := randn(rng, aa.M*aa.Heads*aa.Dim), randn(rng, (aa.Pos0+aa.M-aa.Lo)*aa.Dim), randn(rng, aa.Heads)
	wantA := make([]float32, len(qa))
	dsv4.Attention(wantA, qa, local, keys, want, sinks, aa, make([]float32, aa.MaxKeys()*aa.Dim), make([]float32, aa.MaxKeys()))
	gotA := make(Buffer, len(qa))
	New(3).CompressedAttention(gotA, Buffer(qa), Buffer(local), Buffer(keys), got, Buffer(sinks), aa)
	for i := range wantA {
		if d := math.Abs(float64(gotA[i] - wantA[i])); d > 1e-6 {
			t.Fatalf("CompressedAttention[%d] = %g, reference %g", i, gotA[i], wantA[i])
		}
	}
	// One query (decoding): the score row is split over threads instead.
	ia.M, ia.Pos0 = 1, 27
	want1 := make([]float32, ia.TopK)
	dsv4.IndexTopK(want1, q, keys, w, make([]float32, ia.Entries), ia)
	got1 := make(Buffer, ia.TopK)
	New(3).CompressedIndexTopK(got1, Buffer(q), Buffer(keys), Buffer(w), ia)
	if !slices.Equal([]float32(got1), want1) {
		t.Errorf("CompressedIndexTopK (one query) = %v, want %v", got1, want1)
	}
}
