package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
)

// TestHTreeOps holds the CPU op to htree.Reference in the approximation
// regime and to the dense Attention op when top-K covers every level, in
// prefill and decoding.
func TestHTreeOps(t *testing.T) {
	b := New(2)
	s := layers.AttentionShape{Heads: 4, KVHeads: 2, HeadDim: 16, Scale: 0.25}
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 10000}, s.HeadDim)
	if err != nil {
		t.Fatal(err)
	}
	const n = 157
	rng := rand.New(rand.NewPCG(5, 5))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	q, k, v := fill(n*qw), fill(n*kw), fill(n*kw)
	for _, c := range []struct {
		name  string
		o     htree.Options
		exact bool
	}{
		{"approximate", htree.Options{Rate: 4, TopK: 3, TopCandidates: 6}, false},
		{"exact", htree.Options{Rate: 4, TopK: 48, TopCandidates: 6}, true},
	} {
		want := make([]float32, n*qw)
		if c.exact {
			cache, _ := b.NewKVCache(backendShape(s, n))
			qr, kr := Buffer(append([]float32(nil), q...)), Buffer(append([]float32(nil), k...))
			b.RoPE(qr, n, s.Heads, s.HeadDim, 0, 0, rope, false)
			b.RoPE(kr, n, s.KVHeads, s.HeadDim, 0, 0, rope, false)
			b.Attention(Buffer(want), qr, kr, Buffer(v), cache, 0, 0, n, s)
		} else if err := htree.Reference(want, q, k, v, n, 0, n, s, rope, c.o); err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []int{n, 1} {
			cache, err := b.NewTreeCache(htree.CacheShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: n, Options: c.o, RoPE: rope})
			if err != nil {
				t.Fatal(err)
			}
			got := make([]float32, n*qw)
			for p := 0; p < n; p += chunk {
				m := min(chunk, n-p)
				b.TreeAttention(Buffer(got[p*qw:(p+m)*qw]), Buffer(q[p*qw:(p+m)*qw]), Buffer(k[p*kw:(p+m)*kw]), Buffer(v[p*kw:(p+m)*kw]), cache, 0, p, m, s)
			}
			var d float64
			for i := range got {
				d = max(d, math.Abs(float64(got[i]-want[i])))
			}
			if d > 1e-5 {
				t.Errorf("%s, chunks of %d: max |op - want| = %.3g", c.name, chunk, d)
			}
			if cache.Len() != n {
				t.Errorf("%s: cache len %d, want %d", c.name, cache.Len(), n)
			}
		}
	}
}

// BenchmarkHTreeDecode times one decode step of one attention layer (32
// query heads, 8 KV heads of 128 channels, the shape of Llama-3-8B and
// Qwen3-8B) at a context of 8k, 32k and 128k positions: dense attention
// against htree with the defaults (rate 16, top-K 512). The caches are
// filled directly with random keys and values; the tree's levels are built
// by one Append. tree-MiB is the tree's memory (levels and RoPE table
// included), kv-MiB the dense cache's.
func BenchmarkHTreeDecode(bb *testing.B) {
	s := layers.AttentionShape{Heads: 32, KVHeads: 8, HeadDim: 128, Scale: float32(1 / math.Sqrt(128))}
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 500000}, s.HeadDim)
	if err != nil {
		bb.Fatal(err)
	}
	b := New(0)
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	for _, ctx := range []int{8 << 10, 32 << 10, 128 << 10} {
		n := ctx - 1 // cached positions; the step attends over ctx
		rng := rand.New(rand.NewPCG(uint64(ctx), 1))
		fill := func(x []float32) {
			for i := range x {
				x[i] = float32(rng.Uint32()>>8)/(1<<23) - 1
			}
		}
		kvc, err := b.NewKVCache(backendShape(s, ctx))
		if err != nil {
			bb.Fatal(err)
		}
		dc := kvc.(*kvCache)
		fill(dc.k[0][:n*kw])
		fill(dc.v[0][:n*kw])
		dc.n[0] = n
		hc, err := b.NewTreeCache(htree.CacheShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: ctx, RoPE: rope})
		if err != nil {
			bb.Fatal(err)
		}
		if err := hc.(*htree.Trees).Layer(0).Append(dc.k[0][:n*kw], dc.v[0][:n*kw], 0); err != nil {
			bb.Fatal(err)
		}
		q, k, v, out := make(Buffer, qw), make(Buffer, kw), make(Buffer, kw), make(Buffer, qw)
		fill(q)
		fill(k)
		fill(v)
		name := fmt.Sprintf("ctx=%dk", ctx>>10)
		bb.Run(name+"/dense", func(bb *testing.B) {
			for bb.Loop() {
				kvc.Truncate(n)
				b.Attention(out, q, k, v, kvc, 0, n, 1, s)
			}
			bb.ReportMetric(float64(kvc.Bytes())/(1<<20), "kv-MiB")
		})
		bb.Run(name+"/htree", func(bb *testing.B) {
			for bb.Loop() {
				hc.Truncate(n)
				b.TreeAttention(out, q, k, v, hc, 0, n, 1, s)
			}
			bb.ReportMetric(float64(hc.Bytes())/(1<<20), "tree-MiB")
		})
	}
}

func backendShape(s layers.AttentionShape, capacity int) backend.KVShape {
	return backend.KVShape{Layers: 1, KVHeads: s.KVHeads, HeadDim: s.HeadDim, Capacity: capacity}
}

// TestRoPEDot holds the assembly rotary dot product to htree.RoPEDot on
// every length up to 70 pairs.
func TestRoPEDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for n := range 71 {
		x := make([][]float32, 6)
		for i := range x {
			x[i] = make([]float32, n)
			for j := range x[i] {
				x[i][j] = float32(rng.NormFloat64())
			}
		}
		got := ropeDot(x[0], x[1], x[2], x[3], x[4], x[5])
		var want float64
		for j := range n {
			a1, a2, b1, b2 := float64(x[0][j]), float64(x[1][j]), float64(x[2][j]), float64(x[3][j])
			want += float64(x[4][j])*(a1*b1+a2*b2) + float64(x[5][j])*(a2*b1-a1*b2)
		}
		if d := math.Abs(float64(got) - want); d > 1e-5*(1+math.Sqrt(float64(n))) {
			t.Errorf("n=%d: ropeDot %g, want %g", n, got, want)
		}
	}
}
