package htree

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/layers"
)

func newRoPE(t testing.TB, kind string, hd int) *layers.RoPE {
	t.Helper()
	p := layers.RoPEParams{Theta: 10000}
	switch kind {
	case "interleaved", "default":
	case "partial":
		p.PartialRotaryFactor = 0.5
	case "yarn":
		p = layers.RoPEParams{Type: "yarn", Theta: 10000, Factor: 4, OriginalMaxPositions: 64}
	default:
		t.Fatalf("rope kind %q", kind)
	}
	r, err := layers.NewRoPE(p, hd)
	if err != nil {
		t.Fatal(err)
	}
	r.Interleaved = kind == "interleaved"
	return r
}

// dense is causal attention with RoPE at the true positions: the function
// htree must equal when every candidate is expanded.
func dense(q, k, v []float32, n, pos0, m int, s layers.AttentionShape, r *layers.RoPE) []float32 {
	q, k = slices.Clone(q), slices.Clone(k)
	layers.ApplyRoPE(q, m, s.Heads, s.HeadDim, 0, pos0, r, false)
	layers.ApplyRoPE(k, n, s.KVHeads, s.HeadDim, 0, 0, r, false)
	out := make([]float32, len(q))
	layers.Attention(out, q, k, v, m, pos0, s)
	return out
}

type shape struct {
	heads, kvHeads, hd int
	rope               string
}

func (sh shape) attn() layers.AttentionShape {
	return layers.AttentionShape{Heads: sh.heads, KVHeads: sh.kvHeads, HeadDim: sh.hd, Scale: float32(1 / math.Sqrt(float64(sh.hd)))}
}

// run runs the engine through Trees.Attention over n positions in chunks
// (prefill when chunk >= n, decoding when chunk == 1) and returns every
// query's output.
func run(t testing.TB, q, k, v []float32, n, chunk int, sh shape, o Options) []float32 {
	t.Helper()
	s := sh.attn()
	c, err := NewTrees(CacheShape{Layers: 2, KVHeads: sh.kvHeads, HeadDim: sh.hd, Capacity: n, Options: o, RoPE: newRoPE(t, sh.rope, sh.hd)})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(q))
	qw, kw := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	for p := 0; p < n; p += chunk {
		m := min(chunk, n-p)
		if err := c.Attention(out[p*qw:(p+m)*qw], q[p*qw:(p+m)*qw], k[p*kw:(p+m)*kw], v[p*kw:(p+m)*kw], 1, p, m, s, nil, Kernels{}); err != nil {
			t.Fatal(err)
		}
	}
	if c.Len() != n || c.Layer(0).Len() != 0 {
		t.Fatalf("cache len %d, layer 0 len %d, want %d and 0", c.Len(), c.Layer(0).Len(), n)
	}
	return out
}

func inputs(seed uint64, n int, sh shape) (q, k, v []float32) {
	rng := rand.New(rand.NewPCG(seed, 7))
	return testnum.Normal(rng, n*sh.heads*sh.hd, 0, 1.5), testnum.Normal(rng, n*sh.kvHeads*sh.hd, 0, 1.5), testnum.Normal(rng, n*sh.kvHeads*sh.hd, 0, 1)
}

// TestExactness: when every level's candidates fit in top-K, htree (engine
// and reference, prefill and decoding) is dense causal attention with RoPE at
// the true positions.
func TestExactness(t *testing.T) {
	shapes := []shape{{4, 2, 16, "default"}, {2, 2, 32, "interleaved"}, {6, 3, 16, "partial"}, {4, 1, 16, "yarn"}}
	opts := []struct {
		name string
		o    Options
		n    int
	}{
		{"one level", Options{Rate: 16, TopK: 8}, 128},                     // T <= TopK*Rate: level 0 only
		{"four levels", Options{Rate: 4, TopK: 64, TopCandidates: 8}, 203}, // top level 3, every level <= 64
		{"defaults", Options{}, 150},
	}
	for _, sh := range shapes {
		for _, oc := range opts {
			t.Run(fmt.Sprintf("%s/%dx%dx%d/%s", oc.name, sh.heads, sh.kvHeads, sh.hd, sh.rope), func(t *testing.T) {
				n := oc.n
				q, k, v := inputs(1, n, sh)
				want := dense(q, k, v, n, 0, n, sh.attn(), newRoPE(t, sh.rope, sh.hd))
				if o := oc.o.WithDefaults(); n > o.TopCandidates && o.TopLevel(n-1) == 0 {
					t.Fatalf("bad case")
				}
				ref := make([]float32, len(q))
				if err := Reference(ref, q, k, v, n, 0, n, sh.attn(), newRoPE(t, sh.rope, sh.hd), oc.o); err != nil {
					t.Fatal(err)
				}
				for _, c := range []struct {
					name string
					got  []float32
				}{
					{"reference", ref},
					{"prefill", run(t, q, k, v, n, n, sh, oc.o)},
					{"chunks of 7", run(t, q, k, v, n, 7, sh, oc.o)},
					{"decode", run(t, q, k, v, n, 1, sh, oc.o)},
				} {
					d := testnum.MaxAbsDiff(c.got, want)
					t.Logf("%s: max |htree - dense| = %.3g", c.name, d)
					if d > 1e-5 {
						t.Errorf("%s: max |htree - dense| = %.3g", c.name, d)
					}
				}
			})
		}
	}
}

// TestEngineVsReference: in the approximation regime (several levels
// select), the one-pass engine equals the plain reference, for every query
// position (so every offset within its node), T not a multiple of the rate,
// in prefill and decoding.
func TestEngineVsReference(t *testing.T) {
	cases := []struct {
		sh shape
		o  Options
		n  int
	}{
		{shape{4, 2, 16, "default"}, Options{Rate: 4, TopK: 3, TopCandidates: 8}, 203},
		{shape{2, 1, 32, "interleaved"}, Options{Rate: 2, TopK: 2, TopCandidates: 5}, 77},
		{shape{3, 3, 16, "partial"}, Options{Rate: 3, TopK: 5, TopCandidates: 7}, 250},
		{shape{4, 2, 16, "yarn"}, Options{Rate: 16, TopK: 4, TopCandidates: 20}, 301},
		{shape{2, 2, 8, "default"}, Options{Rate: 5, TopK: 1, TopCandidates: 1}, 131},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("r%d-k%d-n%d/%s", c.o.Rate, c.o.TopK, c.o.TopCandidates, c.sh.rope), func(t *testing.T) {
			if c.n%c.o.Rate == 0 {
				t.Fatalf("T %d is a multiple of the rate", c.n)
			}
			q, k, v := inputs(2, c.n, c.sh)
			ref := make([]float32, len(q))
			if err := Reference(ref, q, k, v, c.n, 0, c.n, c.sh.attn(), newRoPE(t, c.sh.rope, c.sh.hd), c.o); err != nil {
				t.Fatal(err)
			}
			denseOut := dense(q, k, v, c.n, 0, c.n, c.sh.attn(), newRoPE(t, c.sh.rope, c.sh.hd))
			t.Logf("max |reference - dense| = %.3g", testnum.MaxAbsDiff(ref, denseOut))
			if d := testnum.MaxAbsDiff(ref, denseOut); d < 1e-3 {
				t.Errorf("reference within %.3g of dense: the case does not approximate", d)
			}
			for _, chunk := range []int{c.n, 13, 1} {
				d := testnum.MaxAbsDiff(run(t, q, k, v, c.n, chunk, c.sh, c.o), ref)
				t.Logf("chunks of %d: max |engine - reference| = %.3g", chunk, d)
				if d > 1e-5 {
					t.Errorf("chunks of %d: max |engine - reference| = %.3g", chunk, d)
				}
			}
			// A reference over a longer sequence gives the same outputs (causality).
			ref2 := make([]float32, len(q))
			if err := Reference(ref2, q, k, v, c.n, 0, c.n-c.o.Rate-1, c.sh.attn(), newRoPE(t, c.sh.rope, c.sh.hd), c.o); err != nil {
				t.Fatal(err)
			}
			if d := testnum.MaxAbsDiff(ref2[:(c.n-c.o.Rate-1)*c.sh.heads*c.sh.hd], ref); d > 1e-6 {
				t.Errorf("reference depends on later positions: %.3g", d)
			}
		})
	}
}

// TestTreeAppend: a tree grown in any chunks (and truncated and regrown)
// equals the tree built at once, bit for bit.
func TestTreeAppend(t *testing.T) {
	const kvHeads, hd, n = 2, 3, 150
	o := Options{Rate: 3, TopK: 2, TopCandidates: 4}
	rng := rand.New(rand.NewPCG(3, 3))
	k, v := testnum.Normal(rng, n*kvHeads*hd, 0, 1), testnum.Normal(rng, n*kvHeads*hd, 0, 1)
	row := kvHeads * hd
	check := func(t *testing.T, tr *Tree, n int) {
		t.Helper()
		wk, wv := BuildLevels(k, v, n, kvHeads, hd, o.Rate, tr.Levels())
		for l := range tr.Levels() {
			if !slices.Equal(tr.Keys(l), wk[l]) || !slices.Equal(tr.Values(l), wv[l]) {
				t.Fatalf("level %d of %d positions differs from BuildLevels", l, n)
			}
		}
	}
	for _, chunks := range [][]int{{n}, {1}, {5, 1, 9}, {64, 17}} {
		t.Run(fmt.Sprint(chunks), func(t *testing.T) {
			tr, err := NewTree(o, kvHeads, hd, n)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := tr.Levels(), o.WithDefaults().TopLevel(n-1)+1; got != want || got < 3 {
				t.Fatalf("levels %d, want %d (>= 3)", got, want)
			}
			for p, i := 0, 0; p < n; i++ {
				m := min(chunks[i%len(chunks)], n-p)
				if err := tr.Append(k[p*row:(p+m)*row], v[p*row:(p+m)*row], p); err != nil {
					t.Fatal(err)
				}
				p += m
				check(t, tr, p)
			}
			for _, cut := range []int{n - 1, 100, 37, 0} {
				tr.Truncate(cut)
				mid := min(cut+10, n)
				if err := tr.Append(k[cut*row:mid*row], v[cut*row:mid*row], cut); err != nil {
					t.Fatal(err)
				}
				check(t, tr, mid)
				if err := tr.Append(k[mid*row:], v[mid*row:], mid); err != nil {
					t.Fatal(err)
				}
				check(t, tr, n)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	o := Options{}.WithDefaults()
	if o.Rate != 16 || o.TopK != 512 || o.TopCandidates != 8192 || o.MaxCandidates() != 8192 {
		t.Fatalf("defaults %+v", o)
	}
	for _, c := range []struct{ t, level int }{{0, 0}, {8191, 0}, {8192, 1}, {32767, 1}, {131071, 1}, {131072, 2}, {2<<20 - 1, 2}} {
		if got := o.TopLevel(c.t); got != c.level {
			t.Errorf("TopLevel(%d) = %d, want %d", c.t, got, c.level)
		}
	}
	if got := o.Levels(128 << 10); got != 2 {
		t.Errorf("Levels(128k) = %d, want 2", got)
	}
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Rate: 1, TopK: 4, TopCandidates: 4}, "rate 1"},
		{Options{Rate: 2, TopK: 0, TopCandidates: 4}, "top-K 0"},
		{Options{Rate: 2, TopK: 1, TopCandidates: -1}, "top candidates -1"},
	} {
		if err := c.o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", c.o, err, c.want)
		}
	}
}

func TestErrors(t *testing.T) {
	r := newRoPE(t, "default", 8)
	if _, err := NewTrees(CacheShape{Layers: 1, KVHeads: 1, HeadDim: 4, Capacity: 8, RoPE: r}); err == nil {
		t.Error("NewTrees accepted a RoPE wider than the head")
	}
	if _, err := NewTrees(CacheShape{Layers: 0, KVHeads: 1, HeadDim: 8, Capacity: 8, RoPE: r}); err == nil {
		t.Error("NewTrees accepted 0 layers")
	}
	if _, err := NewTree(Options{}, 1, 8, 0); err == nil {
		t.Error("NewTree accepted capacity 0")
	}
	c, err := NewTrees(CacheShape{Layers: 1, KVHeads: 1, HeadDim: 8, Capacity: 4, RoPE: r})
	if err != nil {
		t.Fatal(err)
	}
	s := layers.AttentionShape{Heads: 2, KVHeads: 1, HeadDim: 8, Scale: 1}
	buf := make([]float32, 64)
	for _, c2 := range []struct {
		name           string
		layer, pos0, m int
		s              layers.AttentionShape
		want           string
	}{
		{"layer", 1, 0, 1, s, "layer 1"},
		{"shape", 0, 0, 1, layers.AttentionShape{Heads: 2, KVHeads: 2, HeadDim: 8}, "attention shape"},
		{"gap", 0, 1, 1, s, "append of positions [1, 2)"},
		{"capacity", 0, 0, 5, s, "want"},
	} {
		err := c.Attention(buf, buf, buf, buf, c2.layer, c2.pos0, c2.m, c2.s, nil, Kernels{})
		if err == nil || !strings.Contains(err.Error(), c2.want) {
			t.Errorf("%s: %v, want an error naming %q", c2.name, err, c2.want)
		}
	}
}
