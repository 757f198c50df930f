package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// TestExpF32: expf32 within 2 float32 ulp of e^x (in float64, rounded) over
// the softmax's range, and its ends.
func TestExpF32(t *testing.T) {
	for i := range 200001 {
		x := -90 + float32(i)*(90.0/200000)
		got, want := expf32(x), float32(math.Exp(float64(x)))
		if want < math.SmallestNonzeroFloat32*(1<<23) { // subnormal: flushed to 0
			if got != 0 && math.Abs(float64(got-want)) > 1e-38 {
				t.Fatalf("expf32(%v) = %v, want %v", x, got, want)
			}
			continue
		}
		if ulp := math.Abs(float64(got-want)) / float64(math.Nextafter32(want, 2*want)-want); ulp > 2 {
			t.Fatalf("expf32(%v) = %v, want %v (%.1f ulp)", x, got, want, ulp)
		}
	}
	if expf32(0) != 1 || expf32(float32(math.Inf(-1))) != 0 || !math.IsInf(float64(expf32(100)), 1) {
		t.Errorf("expf32 ends: %v %v %v", expf32(0), expf32(float32(math.Inf(-1))), expf32(100))
	}
}

// TestAttn4Kernels holds scores4 and values4 (the AVX2 kernels where they
// apply) to the portable Go ones, on head dims on and off the kernels' 16.
func TestAttn4Kernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 4))
	for _, s := range [][3]int{{1, 16, 16}, {7, 64, 256}, {33, 48, 100}, {130, 128, 512}, {5, 40, 40}} {
		n, hd, stride := s[0], s[1], s[2]
		q, k := randn(rng, 4*hd), randn(rng, (n-1)*stride+hd)
		t.Run(fmt.Sprint(s), func(t *testing.T) {
			got, want := make([]float32, 4*n), make([]float32, 4*n)
			scores4(q, k, stride, n, hd, 0.125, got)
			scores4Go(q, k, stride, n, hd, 0.125, want)
			closeF32(t, "scores4", got, want, 1e-5)
			acc, accGo := make([]float32, 4*hd), make([]float32, 4*hd)
			values4(acc, got, k, stride, n, hd)
			values4Go(accGo, got, k, stride, n, hd)
			closeF32(t, "values4", acc, accGo, 1e-5)
		})
	}
}

// closeF32 fails when |got-want| > tol*(1+|want|) anywhere.
func closeF32(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestSoftmax4Fast holds attend4's assembly softmax steps (max4Fast,
// exp4Fast, where the processor has them) to its loops: the same maxima,
// expf32 of every score bit for bit, the sums within float32 rounding
// (added in another order).
func TestSoftmax4Fast(t *testing.T) {
	for _, avx2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("avx2=%v", avx2), func(t *testing.T) {
			forceAVX2 = avx2
			defer func() { forceAVX2 = false }()
			testSoftmax4Fast(t)
		})
	}
}

func testSoftmax4Fast(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 21))
	for _, n := range []int{1, 4, 7, 64, 1001} {
		sc := make([]float32, 4*n)
		for i := range sc {
			sc[i] = float32(rng.NormFloat64() * 30)
			if rng.IntN(50) == 0 {
				sc[i] = -200 // below expf32's zero bound after the max
			}
		}
		want := append([]float32(nil), sc...)
		var mx, sum, wmx, wsum [4]float32
		for g := range mx {
			mx[g], wmx[g] = float32(math.Inf(-1)), float32(math.Inf(-1))
		}
		n4 := max4Fast(sc, n, &mx)
		for r := n4; r < n; r++ {
			for g := range 4 {
				mx[g] = max(mx[g], sc[4*r+g])
			}
		}
		exp4Fast(sc, n4, &mx, &sum)
		for r := range n {
			for g := range 4 {
				wmx[g] = max(wmx[g], want[4*r+g])
			}
		}
		if mx != wmx {
			t.Fatalf("n=%d: maxima %v, want %v", n, mx, wmx)
		}
		for r := range n4 {
			for g := range 4 {
				e := expf32(want[4*r+g] - wmx[g])
				if math.Float32bits(sc[4*r+g]) != math.Float32bits(e) {
					t.Fatalf("n=%d row %d group %d: %v, expf32 %v", n, r, g, sc[4*r+g], e)
				}
				wsum[g] += e
			}
		}
		closeF32(t, fmt.Sprintf("n=%d sums", n), sum[:], wsum[:], 1e-6)
	}
}

// TestExp4Ends: exp4Fast's answers at expf32's bounds and for NaN, bit for
// bit expf32's.
func TestExp4Ends(t *testing.T) {
	x := []float32{0, -1e-3, -87.33654, -87.3365, -87.34, -88, -103, -1e30, float32(math.Inf(-1)), 88.72, 88.7, 89,
		float32(math.Inf(1)), float32(math.NaN()), 1, -0.5, 0.3466, -0.3466, 44.36, -44.36}
	for len(x)%16 != 0 {
		x = append(x, float32(len(x))-40)
	}
	var probe [4]float32
	if max4Fast(make([]float32, 16), 4, &probe) == 0 {
		t.Skip("no assembly softmax") // exp4Fast is only called where max4Fast took rows
	}
	for _, avx2 := range []bool{false, true} {
		if !avx2 && !hasAVX512VL {
			continue
		}
		forceAVX2 = avx2
		sc := append([]float32(nil), x...)
		var mx, sum [4]float32
		exp4Fast(sc, len(x)/4, &mx, &sum)
		forceAVX2 = false
		for i, v := range x {
			if e := expf32(v); math.Float32bits(sc[i]) != math.Float32bits(e) {
				t.Errorf("avx2=%v: exp4 of %v: %v, expf32 %v", avx2, v, sc[i], e)
			}
		}
	}
}

// TestAttnParts: decode's 8 jobs (issue 61's model) are split so that
// every thread has the same share, not at all where they already do, and
// never below attnMinKeys keys a part.
func TestAttnParts(t *testing.T) {
	for _, c := range []struct{ units, threads, keys, want int }{
		{8, 1, 4096, 1}, {8, 2, 4096, 1}, {8, 4, 4096, 1}, {8, 8, 4096, 1},
		{8, 16, 4096, 2}, {8, 32, 4096, 4}, {8, 3, 4096, 3}, {8, 6, 4096, 3}, {8, 12, 4096, 3},
		{8, 7, 4096, 7}, {8, 16, 100, 1}, {8, 16, 64, 1}, {8, 16, 128, 2}, {8, 7, 200, 3},
		{512, 16, 4096, 1}, {4, 16, 4096, 4}, {1, 16, 4096, 16},
	} {
		if got := attnParts(c.units, c.threads, c.keys); got != c.want {
			t.Errorf("attnParts(%d jobs, %d threads, %d keys) = %d, want %d", c.units, c.threads, c.keys, got, c.want)
		}
	}
}

// TestAttentionSplit: decode attention split over the keys (threads that
// do not divide the jobs) matches the float64 reference within the
// conformance table's tolerance for Attention (2e-5 of the largest
// output), as the unsplit path on 1 thread does, windowed and not, with
// short rows whose last parts have no keys (a prompt's first rows on 64
// threads).
func TestAttentionSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 23))
	for _, c := range []struct{ heads, kv, hd, pos0, m, window int }{
		{32, 8, 64, 700, 1, 0}, {32, 8, 64, 2100, 1, 0}, {16, 2, 128, 1000, 1, 0}, {8, 2, 64, 300, 2, 0},
		{32, 8, 64, 900, 1, 256}, {8, 2, 64, 500, 3, 130}, {32, 8, 48, 333, 1, 0}, {8, 2, 64, 0, 200, 0},
	} {
		s := layers.AttentionShape{Heads: c.heads, KVHeads: c.kv, HeadDim: c.hd, Scale: float32(1 / math.Sqrt(float64(c.hd))), Window: c.window}
		n := c.pos0 + c.m
		q := randn(rng, c.m*c.heads*c.hd)
		k, v := randn(rng, n*c.kv*c.hd), randn(rng, n*c.kv*c.hd)
		want := make([]float32, len(q))
		layers.Attention(want, q, k, v, c.m, c.pos0, s)
		split := 0
		for _, threads := range []int{1, 3, 6, 7, 16, 64} {
			b := New(threads)
			cache, _ := b.NewKVCache(backend.KVShape{Layers: 1, KVHeads: c.kv, HeadDim: c.hd, Capacity: n})
			row := c.kv * c.hd
			kc := cache.(*kvCache) // the first pos0 positions as a prompt would leave them
			copy(kc.k[0], k[:c.pos0*row])
			copy(kc.v[0], v[:c.pos0*row])
			kc.n[0] = c.pos0
			got := make(Buffer, len(q))
			b.Attention(got, Buffer(q), Buffer(k[c.pos0*row:]), Buffer(v[c.pos0*row:]), cache, 0, c.pos0, c.m, s)
			scale := 1.0
			for _, w := range want {
				scale = max(scale, math.Abs(float64(w)))
			}
			keys := n
			if c.window > 0 {
				keys = min(n, c.window)
			}
			parts := attnParts(c.m*c.heads/4, threads, keys)
			split += parts - 1
			d := maxDiff(got, want)
			if d > 2e-5*scale {
				t.Errorf("%+v, %d threads (%d parts): max diff %.3g", c, threads, parts, d)
			}
			t.Logf("%+v, %d threads: %d parts, max diff %.2g", c, threads, parts, d/scale)
		}
		if split == 0 {
			t.Errorf("%+v: never split", c)
		}
	}
}
