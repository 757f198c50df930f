package mhc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/manifoldlm/manifold/internal/testnum"
)

// ---------------------------------------------------------------------------
// A direct transcription of seed 000's formulas, in float64, one token at a
// time. With eps = 0 it is the seed verbatim:
//
//	r      = sqrt(sum(X^2) / (nC))
//	H~     = X · phi                        (one GEMM, split into pre|post|res)
//	H_pre  = sigmoid(a_pre  * H~_pre  / r + b_pre)
//	H_post = 2 * sigmoid(a_post * H~_post / r + b_post)
//	H_res  = SinkhornKnopp(a_res * H~_res / r + b_res):
//	         exp, then `iters` times (row normalization, column normalization)
//	F_pre  = sum_i H_pre[i] * X[i]
//	X_next = H_res' · X + H_post^T · F_out
//
// With eps > 0 it adds DeepSeek-V4's eps terms where the reference modeling
// code has them (r gets rms_norm_eps under the root, pre gets +hc_eps, every
// Sinkhorn denominator gets +hc_eps and the first normalized matrix +hc_eps).
//
// One deliberate difference from the seed's text: the seed applies H_res as
// H_res · X (output i = sum_j H_res[i,j] X[j]); DeepSeek-V4's decoder layer
// applies comb transposed (output k = sum_j comb[j,k] X[j]). The reference is
// the authority, so seedPost uses H_res' = H_resᵀ.
// ---------------------------------------------------------------------------

type seedCoeffs struct {
	pre, post []float64
	res       [][]float64
}

func seedSinkhorn(z [][]float64, iters int, eps float64) [][]float64 {
	n := len(z)
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
		for j := range m[i] {
			m[i][j] = math.Exp(z[i][j])
		}
	}
	// norm divides each row (byRow) or column of m by its sum plus extra.
	norm := func(byRow bool, extra float64) {
		at := func(a, b int) *float64 {
			if byRow {
				return &m[a][b]
			}
			return &m[b][a]
		}
		for a := 0; a < n; a++ {
			s := 0.0
			for b := 0; b < n; b++ {
				s += *at(a, b)
			}
			for b := 0; b < n; b++ {
				*at(a, b) /= s + extra
			}
		}
	}
	for it := 0; it < iters; it++ {
		if it == 0 {
			norm(true, 0) // the reference's softmax: no eps in this denominator...
			for i := range m {
				for j := range m[i] {
					m[i][j] += eps // ...but eps added after it
				}
			}
		} else {
			norm(true, eps)
		}
		norm(false, eps)
	}
	return m
}

func seedCoefficients(x []float64, fn []float64, base []float64, scale [3]float64, n, c, iters int, eps, normEps float64) seedCoeffs {
	width := n * c
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	r := math.Sqrt(ss/float64(width) + normEps)
	mix := len(fn) / width
	h := make([]float64, mix)
	for m := range h {
		for k := 0; k < width; k++ {
			h[m] += x[k] * fn[m*width+k]
		}
	}
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	var out seedCoeffs
	for i := 0; i < n; i++ {
		out.pre = append(out.pre, sig(scale[0]*h[i]/r+base[i])+eps)
		out.post = append(out.post, 2*sig(scale[1]*h[n+i]/r+base[n+i]))
	}
	z := make([][]float64, n)
	for i := range z {
		z[i] = make([]float64, n)
		for j := range z[i] {
			z[i][j] = scale[2]*h[2*n+i*n+j]/r + base[2*n+i*n+j]
		}
	}
	out.res = seedSinkhorn(z, iters, eps)
	return out
}

func seedPre(x []float64, pre []float64, n, c int) []float64 {
	out := make([]float64, c)
	for i := 0; i < n; i++ {
		for k := 0; k < c; k++ {
			out[k] += pre[i] * x[i*c+k]
		}
	}
	return out
}

func seedPost(x, fout, post []float64, res [][]float64, n, c int) []float64 {
	out := make([]float64, n*c)
	for i := 0; i < n; i++ {
		for k := 0; k < c; k++ {
			acc := 0.0
			for j := 0; j < n; j++ {
				acc += res[j][i] * x[j*c+k] // H_res' = H_resᵀ (see above)
			}
			out[i*c+k] = acc + post[i]*fout[k]
		}
	}
	return out
}

// ---------------------------------------------------------------------------

func f64(s []float32) []float64 {
	d := make([]float64, len(s))
	for i, v := range s {
		d[i] = float64(v)
	}
	return d
}

func maxRelErr(got []float32, want []float64) float64 {
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i])-want[i]) / max(1, math.Abs(want[i]))
		worst = max(worst, d)
	}
	return worst
}

func TestCoefficientsMatchSeed(t *testing.T) {
	cases := []struct {
		name           string
		n, c, iters    int
		eps, normEps   float32
		fnStd, scaleMu float64
	}{
		{"seed verbatim n4", 4, 64, 20, 0, 0, 0.05, 1},
		{"seed verbatim n3", 3, 40, 20, 0, 0, 0.05, 1},
		{"v4 eps n4", 4, 64, 20, 1e-6, 1e-6, 0.05, 1},
		{"v4 eps n2 few iters", 2, 33, 3, 1e-6, 1e-6, 0.1, 0.7},
		{"v4 eps n6", 6, 16, 20, 1e-6, 1e-6, 0.05, 1.3},
		{"one iteration", 4, 8, 1, 1e-6, 1e-6, 0.1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(tc.n*1000+tc.c)))
			cfg := Config{Streams: tc.n, Hidden: tc.c, SinkhornIters: tc.iters, Eps: tc.eps, NormEps: tc.normEps}
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			const rows = 3
			w := Weights{
				Fn:    testnum.Normal(rng, cfg.MixDim()*cfg.Width(), 0, tc.fnStd),
				Base:  testnum.Normal(rng, cfg.MixDim(), 0, 0.3),
				Scale: testnum.Normal(rng, 3, tc.scaleMu, 0.2),
			}
			if err := cfg.Check(w); err != nil {
				t.Fatal(err)
			}
			x := testnum.Normal(rng, rows*cfg.Width(), 0.1, 1)
			co := cfg.NewCoeffs(rows)
			logits := make([]float32, rows*cfg.MixDim())
			m.Coefficients(co, logits, x, w, rows)

			fout := testnum.Normal(rng, rows*tc.c, 0, 1)
			pre := make([]float32, rows*tc.c)
			Pre(pre, x, co.Pre, rows, tc.n, tc.c)
			post := make([]float32, rows*cfg.Width())
			Post(post, x, fout, co.Post, co.Res, make([]float32, tc.n), rows, tc.n, tc.c)

			scale := [3]float64{float64(w.Scale[0]), float64(w.Scale[1]), float64(w.Scale[2])}
			for r := 0; r < rows; r++ {
				xr := f64(x[r*cfg.Width() : (r+1)*cfg.Width()])
				want := seedCoefficients(xr, f64(w.Fn), f64(w.Base), scale, tc.n, tc.c, tc.iters, float64(tc.eps), float64(tc.normEps))
				n := tc.n
				if e := maxRelErr(co.Pre[r*n:(r+1)*n], want.pre); e > 1e-5 {
					t.Errorf("row %d pre: max rel err %.3g", r, e)
				}
				if e := maxRelErr(co.Post[r*n:(r+1)*n], want.post); e > 1e-5 {
					t.Errorf("row %d post: max rel err %.3g", r, e)
				}
				var flat []float64
				for _, row := range want.res {
					flat = append(flat, row...)
				}
				if e := maxRelErr(co.Res[r*n*n:(r+1)*n*n], flat); e > 1e-5 {
					t.Errorf("row %d res: max rel err %.3g", r, e)
				}
				wantPre := seedPre(xr, want.pre, n, tc.c)
				if e := maxRelErr(pre[r*tc.c:(r+1)*tc.c], wantPre); e > 1e-5 {
					t.Errorf("row %d Pre: max rel err %.3g", r, e)
				}
				wantPost := seedPost(xr, f64(fout[r*tc.c:(r+1)*tc.c]), want.post, want.res, n, tc.c)
				if e := maxRelErr(post[r*cfg.Width():(r+1)*cfg.Width()], wantPost); e > 1e-5 {
					t.Errorf("row %d Post: max rel err %.3g", r, e)
				}
			}
		})
	}
}

// TestSinkhornDoublyStochastic checks the Sinkhorn output's row and column
// sums. The last step normalizes columns, so columns sum to 1 (less O(eps))
// for any input. Rows converge geometrically, at a rate set by the spread of
// the logits: 20 iterations (V4's hc_sinkhorn_iters) bring every row within
// 1e-5 for logits of standard deviation up to 0.5 (what a model initialized
// like the reference produces: fn ~ N(0, 0.02) over n*C = 512 inputs gives
// logits of std ≈ 0.45), while for std 2 the reference's own algorithm leaves
// rows off by up to ~3e-2 after 20 iterations (measured: 2.7e-2 for n=4), so
// those cases get the iterations they need.
func TestSinkhornDoublyStochastic(t *testing.T) {
	cases := []struct {
		std   float64
		iters int
	}{
		{0.1, 20}, {0.5, 20}, {1, 200}, {1.5, 400},
	}
	for _, n := range []int{1, 2, 3, 4, 6, 8} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("n%d_std%g_iters%d", n, tc.std, tc.iters), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.std*10)))
				for trial := 0; trial < 50; trial++ {
					m := testnum.Normal(rng, n*n, 0, tc.std)
					SinkhornKnopp(m, n, tc.iters, 1e-6)
					for i := 0; i < n; i++ {
						var rs, cs float64
						for j := 0; j < n; j++ {
							if m[i*n+j] < 0 {
								t.Fatalf("negative entry %g", m[i*n+j])
							}
							rs += float64(m[i*n+j])
							cs += float64(m[j*n+i])
						}
						if math.Abs(rs-1) > 1e-5 || math.Abs(cs-1) > 1e-5 {
							t.Fatalf("trial %d: row %d sums to %.8f, column %d to %.8f", trial, i, rs, i, cs)
						}
					}
				}
			})
		}
	}
	// Columns are normalized last: within 1e-5 at 20 iterations whatever the spread.
	rng := rand.New(rand.NewPCG(11, 11))
	for trial := 0; trial < 200; trial++ {
		const n = 4
		m := testnum.Normal(rng, n*n, 0, 4)
		SinkhornKnopp(m, n, 20, 1e-6)
		for j := 0; j < n; j++ {
			var cs float64
			for i := 0; i < n; i++ {
				cs += float64(m[i*n+j])
			}
			if math.Abs(cs-1) > 1e-5 {
				t.Fatalf("column %d sums to %.8f", j, cs)
			}
		}
	}
}

// TestSinkhornEqualsSeedWithoutEps checks the claim in SinkhornKnopp's doc:
// softmax-then-(iters-1) is seed 000's exp-then-iters loop when eps = 0.
func TestSinkhornEqualsSeedWithoutEps(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range []int{2, 4, 5} {
		z := testnum.Normal(rng, n*n, 0, 1.5)
		zz := make([][]float64, n)
		for i := range zz {
			zz[i] = f64(z[i*n : (i+1)*n])
		}
		want := seedSinkhorn(zz, 20, 0)
		SinkhornKnopp(z, n, 20, 0)
		var flat []float64
		for _, r := range want {
			flat = append(flat, r...)
		}
		if e := maxRelErr(z, flat); e > 1e-6 {
			t.Errorf("n=%d: max err %.3g", n, e)
		}
	}
}

func TestPermutations(t *testing.T) {
	for n := 1; n <= 6; n++ {
		ps := Permutations(n)
		if len(ps) != factorial(n) {
			t.Fatalf("n=%d: %d permutations, want %d", n, len(ps), factorial(n))
		}
		seen := map[string]bool{}
		for k, p := range ps {
			used := make([]bool, n)
			for _, v := range p {
				if v < 0 || v >= n || used[v] {
					t.Fatalf("n=%d: %v is not a permutation", n, p)
				}
				used[v] = true
			}
			key := fmt.Sprint(p)
			if seen[key] {
				t.Fatalf("n=%d: %v repeated", n, p)
			}
			seen[key] = true
			if k > 0 && !lexLess(ps[k-1], p) {
				t.Fatalf("n=%d: %v before %v is not lexicographic", n, ps[k-1], p)
			}
		}
		for i, v := range ps[0] {
			if v != i {
				t.Fatalf("n=%d: first permutation %v is not the identity", n, ps[0])
			}
		}
	}
}

func lexLess(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// TestLiteConvexCombination checks that mHC-lite's residual matrix is exactly
// sum_k a_k P_k with a_k >= 0 and sum a_k = 1: the weights come back in z, the
// matrix is rebuilt from them and the permutation matrices independently and
// compared bit for bit, and its rows and columns sum to 1.
func TestLiteConvexCombination(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5} {
		t.Run(fmt.Sprint("n", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(n)))
			cfg := Config{Streams: n, Hidden: 8, Eps: 1e-6, NormEps: 1e-6, Residual: Lite}
			m, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MixDim() != 2*n+factorial(n) {
				t.Fatalf("MixDim %d, want %d", cfg.MixDim(), 2*n+factorial(n))
			}
			const rows = 4
			w := Weights{
				Fn:    testnum.Normal(rng, cfg.MixDim()*cfg.Width(), 0, 0.3),
				Base:  testnum.Normal(rng, cfg.MixDim(), 0, 0.5),
				Scale: testnum.Normal(rng, 3, 1, 0.2),
			}
			x := testnum.Normal(rng, rows*cfg.Width(), 0, 1)
			co := cfg.NewCoeffs(rows)
			logits := make([]float32, rows*cfg.MixDim())
			m.Coefficients(co, logits, x, w, rows)
			perms := Permutations(n)
			for r := 0; r < rows; r++ {
				a := logits[r*cfg.MixDim()+2*n : (r+1)*cfg.MixDim()]
				var sa float64
				for _, v := range a {
					if v < 0 {
						t.Fatalf("negative weight %g", v)
					}
					sa += float64(v)
				}
				if math.Abs(sa-1) > 1e-6 {
					t.Fatalf("weights sum to %.9f", sa)
				}
				want := make([]float32, n*n)
				for k, p := range perms {
					for i := 0; i < n; i++ {
						for j := 0; j < n; j++ {
							var pij float32
							if p[i] == j {
								pij = 1
							}
							want[i*n+j] += a[k] * pij
						}
					}
				}
				got := co.Res[r*n*n : (r+1)*n*n]
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("row %d: res[%d] = %g, convex combination gives %g", r, i, got[i], want[i])
					}
				}
				for i := 0; i < n; i++ {
					var rs, cs float64
					for j := 0; j < n; j++ {
						rs += float64(got[i*n+j])
						cs += float64(got[j*n+i])
					}
					if math.Abs(rs-1) > 1e-6 || math.Abs(cs-1) > 1e-6 {
						t.Fatalf("row sum %.9f, column sum %.9f", rs, cs)
					}
				}
			}
		})
	}
}

func TestHeadCollapse(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{1, 3, 4} {
		cfg := Config{Streams: n, Hidden: 24, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6}
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		const rows = 3
		h := HeadWeights{Fn: testnum.Normal(rng, n*cfg.Width(), 0, 0.1), Base: testnum.Normal(rng, n, 0, 0.3), Scale: 0.9}
		if err := cfg.CheckHead(h); err != nil {
			t.Fatal(err)
		}
		x := testnum.Normal(rng, rows*cfg.Width(), 0, 1)
		dst := make([]float32, rows*cfg.Hidden)
		pre := make([]float32, rows*n)
		m.HeadCollapse(dst, x, pre, h, rows)
		for r := 0; r < rows; r++ {
			xr := f64(x[r*cfg.Width() : (r+1)*cfg.Width()])
			ss := 0.0
			for _, v := range xr {
				ss += v * v
			}
			rms := math.Sqrt(ss/float64(len(xr)) + 1e-6)
			w := make([]float64, n)
			for i := range w {
				d := 0.0
				for k, v := range xr {
					d += v * float64(h.Fn[i*len(xr)+k])
				}
				w[i] = 1/(1+math.Exp(-(d/rms*0.9+float64(h.Base[i])))) + 1e-6
			}
			want := seedPre(xr, w, n, cfg.Hidden)
			if e := maxRelErr(dst[r*cfg.Hidden:(r+1)*cfg.Hidden], want); e > 1e-5 {
				t.Errorf("n=%d row %d: max rel err %.3g", n, r, e)
			}
		}
	}
}

func TestPostInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const rows, n, c = 2, 4, 10
	x := testnum.Normal(rng, rows*n*c, 0, 1)
	out := testnum.Normal(rng, rows*c, 0, 1)
	post := testnum.Normal(rng, rows*n, 1, 0.5)
	res := testnum.Normal(rng, rows*n*n, 0.25, 0.2)
	want := make([]float32, len(x))
	Post(want, x, out, post, res, make([]float32, n), rows, n, c)
	Post(x, x, out, post, res, make([]float32, n), rows, n, c)
	for i := range x {
		if x[i] != want[i] {
			t.Fatalf("in-place Post differs at %d: %g vs %g", i, x[i], want[i])
		}
	}
}

func TestExpand(t *testing.T) {
	emb := []float32{1, 2, 3, 4, 5, 6}
	dst := make([]float32, 2*3*3)
	Expand(dst, emb, 2, 3, 3)
	want := []float32{1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6}
	for i := range want {
		if dst[i] != want[i] {
			t.Fatalf("Expand = %v, want %v", dst, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	good := Config{Streams: 4, Hidden: 8, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6}
	cases := []struct {
		name string
		edit func(*Config)
	}{
		{"streams", func(c *Config) { c.Streams = 0 }},
		{"hidden", func(c *Config) { c.Hidden = 0 }},
		{"iters", func(c *Config) { c.SinkhornIters = 0 }},
		{"eps", func(c *Config) { c.Eps = -1 }},
		{"lite too wide", func(c *Config) { c.Residual = Lite; c.Streams = 9 }},
		{"mode", func(c *Config) { c.Residual = 7 }},
	}
	if _, err := New(good); err != nil {
		t.Fatalf("good config: %v", err)
	}
	for _, tc := range cases {
		c := good
		tc.edit(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := good.Check(Weights{Fn: make([]float32, 3), Base: make([]float32, 24), Scale: make([]float32, 3)}); err == nil {
		t.Error("short fn accepted")
	}
	if err := good.Check(Weights{Fn: make([]float32, 24*32), Base: make([]float32, 23), Scale: make([]float32, 3)}); err == nil {
		t.Error("short base accepted")
	}
	if err := good.Check(Weights{Fn: make([]float32, 24*32), Base: make([]float32, 24), Scale: make([]float32, 1)}); err == nil {
		t.Error("short scale accepted")
	}
	for s, want := range map[string]Residual{"": Sinkhorn, "sinkhorn": Sinkhorn, "lite": Lite} {
		if got, err := ParseResidual(s); err != nil || got != want {
			t.Errorf("ParseResidual(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseResidual("birkhoff"); err == nil {
		t.Error("unknown mode accepted")
	}
}

func benchSite(b *testing.B, n, c int, mode Residual) {
	rng := rand.New(rand.NewPCG(1, 1))
	cfg := Config{Streams: n, Hidden: c, SinkhornIters: 20, Eps: 1e-6, NormEps: 1e-6, Residual: mode}
	m, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	w := Weights{Fn: testnum.Normal(rng, cfg.MixDim()*cfg.Width(), 0, 0.02), Base: make([]float32, cfg.MixDim()), Scale: []float32{1, 1, 1}}
	x := testnum.Normal(rng, cfg.Width(), 0, 1)
	co := cfg.NewCoeffs(1)
	logits := make([]float32, cfg.MixDim())
	in := make([]float32, c)
	out := testnum.Normal(rng, c, 0, 1)
	tmp := make([]float32, n)
	b.SetBytes(int64(4 * (cfg.MixDim()*cfg.Width() + 3*cfg.Width())))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		m.Coefficients(co, logits, x, w, 1)
		Pre(in, x, co.Pre, 1, n, c)
		Post(x, x, out, co.Post, co.Res, tmp, 1, n, c)
	}
}

// BenchmarkSite is one decode token through one hyper-connection site
// (coefficients, pre and post) at DeepSeek-V4-Flash's width.
func BenchmarkSite(b *testing.B) {
	b.Run("sinkhorn_n4_C4096", func(b *testing.B) { benchSite(b, 4, 4096, Sinkhorn) })
	b.Run("lite_n4_C4096", func(b *testing.B) { benchSite(b, 4, 4096, Lite) })
}

func BenchmarkSinkhorn(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	z := testnum.Normal(rng, 16, 0, 1)
	m := make([]float32, 16)
	for i := 0; i < b.N; i++ {
		copy(m, z)
		SinkhornKnopp(m, 4, 20, 1e-6)
	}
}
