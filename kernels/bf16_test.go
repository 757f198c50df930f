package kernels

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// TestG16Pick holds the 16-bit GEMM's tile choice to the smallest token
// tile that holds m (the largest past 128), and force to its tile.
func TestG16Pick(t *testing.T) {
	for _, tc := range []struct{ m, force, want int }{
		{5, 0, 16}, {16, 0, 16}, {17, 0, 32}, {32, 0, 32}, {33, 0, 64}, {64, 0, 64}, {65, 0, 128}, {512, 0, 128},
		{5, 128, 128}, {512, 16, 16}, {100, 32, 32},
	} {
		if got := g16Pick(tc.m, tc.force).bt; got != tc.want {
			t.Errorf("m %d, force %d: tile %d, want %d", tc.m, tc.force, got, tc.want)
		}
	}
	for _, k := range g16Kernels() {
		// Two blocks a multiprocessor in an H100's 228 KiB, each with 1 KiB
		// the system keeps; and whole 16-feature warp tiles.
		if 2*(k.shared()+1024+16) > 228<<10 {
			t.Errorf("%s: %d bytes of shared memory do not fit two blocks", k.name(false), k.shared())
		}
		if (128/k.wf)%16 != 0 || (k.bt/k.wt)%16 != 0 || k.bk%16 != 0 {
			t.Errorf("%s: warp tile %d x %d, stage %d", k.name(false), 128/k.wf, k.bt/k.wt, k.bk)
		}
	}
}

// gemm16Want is x (m rows of k) times the decoded weights vals (n rows of
// k) transposed, plus bias, summed in float64: the 16-bit GEMMs' reference.
func gemm16Want(x, vals, bias []float32, m, n, k int) []float32 {
	want := make([]float32, m*n)
	for i := range m {
		for r := range n {
			var s float64
			for j := range k {
				s += float64(x[i*k+j]) * float64(vals[r*k+j])
			}
			want[i*n+r] = float32(s + float64(bias[r]))
		}
	}
	return want
}

// TestGemm16 runs the 16-bit GEMM (bf16.cuh) in bf16 and f16, each token
// tile forced, with K split and not, against float64 sums of the decoded
// weights and float32 activations: x as two 16-bit halves leaves a relative
// error near 2^-16, far under 1e-4.
func TestGemm16(t *testing.T) {
	g := newGPU(t)
	rng := rand.New(rand.NewPCG(5, 7))
	for _, sh := range []struct{ m, n, k int }{{5, 130, 200}, {16, 256, 4096}, {17, 77, 384}, {100, 300, 776}, {130, 129, 136}, {512, 200, 264}, {3, 1000, 8}} {
		for _, f16 := range []bool{false, true} {
			w, vals := gemm16Weight(t, g, rng, sh.n, sh.k, f16)
			x := randn(rng, sh.m*sh.k)
			xg := toGPU(g, x).(*Buffer)
			want := gemm16Want(x, vals, w.biasHost, sh.m, sh.n, sh.k)
			for _, tile := range []int{0, 16, 32, 64, 128} {
				for _, splits := range []int{0, 1, 3} {
					g.force.g16Tile, g.force.g16Splits = tile, splits
					out := g.NewBuffer(sh.m * sh.n)
					g.gemm16(out.(*Buffer), xg, w.Weight, sh.m, f16)
					if e := relErr(fromGPU(t, g, out), want); e > 1e-4 {
						t.Errorf("f16 %v, %+v, tile %d, splits %d: relative error %.3g", f16, sh, tile, splits, e)
					}
				}
			}
		}
	}
	g.force.g16Tile, g.force.g16Splits = 0, 0
}

// TestBF16Joined runs a Llama block's bf16 matvecs as a decode step queues
// them (q, k and v of one row; the output projection and its residual add;
// gate and up and their SwiGLU, clamped and not; the down projection and
// its residual add; a matvec nothing joins) on the GPU, with and without
// graphs and at m = 1 and 3, against the CPU backend; and checks that the
// fusion pass joined them: q, k, v in one launch, the epilogues taken in.
func TestBF16Joined(t *testing.T) {
	for _, graphs := range []GraphMode{GraphsOn, GraphsOff} {
		for _, m := range []int{1, 3} {
			for _, limit := range []float32{0, 0.5} {
				t.Run(fmt.Sprintf("graphs=%v/m=%d/limit=%g", graphs, m, limit), func(t *testing.T) {
					testBF16Joined(t, graphs, m, limit)
				})
			}
		}
	}
}

func testBF16Joined(t *testing.T, graphs GraphMode, m int, limit float32) {
	g, c := newGPU(t), refCPU()
	g.SetGraphs(graphs)
	rng := rand.New(rand.NewPCG(9, uint64(m)))
	hidden, qn, kvn, ffn, out := 1024, 1024, 256, 2816, 1200 // out: a matvec nothing joins
	type pair struct{ c, g backend.Weight }
	mk := func(n, k int, bias bool) pair {
		h := scaledWeight(rng, backend.BF16, n, k)
		if bias {
			h.Bias = randn(rng, n)
		}
		wc, wg := uploadBoth(t, g, c, h)
		return pair{wc, wg}
	}
	wq, wk, wv, wo := mk(qn, hidden, true), mk(kvn, hidden, true), mk(kvn, hidden, false), mk(hidden, qn, false)
	wgate, wup, wdown, wout := mk(ffn, hidden, false), mk(ffn, hidden, true), mk(hidden, ffn, true), mk(out, hidden, false)
	x0 := randn(rng, m*hidden)
	type bufs struct{ x, q, k, v, gate, up, o backend.Buffer }
	newBufs := func(b backend.Backend) bufs {
		nb := b.NewBuffer
		u := bufs{nb(m * hidden), nb(m * qn), nb(m * kvn), nb(m * kvn), nb(m * ffn), nb(m * ffn), nb(m * out)}
		b.Write(u.x, 0, x0)
		return u
	}
	bc, bg := newBufs(c), newBufs(g)
	step := func(b backend.Backend, u bufs, w func(pair) backend.Weight, check func(string, int)) {
		b.MatMul(u.q, u.x, w(wq), m)
		b.MatMul(u.k, u.x, w(wk), m)
		b.MatMul(u.v, u.x, w(wv), m)
		check("q, k, v", 3)
		b.MatMul(u.gate, u.q, w(wo), m) // gate's first hidden values: the projection's output
		b.Add(u.x, u.x, b.View(u.gate, 0, m*hidden))
		b.MatMul(u.gate, u.x, w(wgate), m)
		b.MatMul(u.up, u.x, w(wup), m)
		b.SwiGLU(u.gate, u.gate, u.up, limit)
		check("gate, up + SwiGLU", 2)
		b.MatMul(u.q, u.gate, w(wdown), m) // q's first hidden values
		b.Add(u.x, u.x, b.View(u.q, 0, m*hidden))
		check("down + add", 1)
		b.MatMul(u.o, u.x, w(wout), m)
	}
	none := func(string, int) {}
	joined := func(what string, groups int) {
		g.qmu.Lock()
		defer g.qmu.Unlock()
		ops := g.q.ops
		if len(ops) == 0 || ops[len(ops)-1].gemv == nil || len(ops[len(ops)-1].gemv.groups) != groups {
			t.Errorf("%s: the last queued op is not one matvec of %d weights", what, groups)
		}
	}
	for i := range 2 {
		check := joined
		if i > 0 {
			check = none // the step's first matvecs may join the last one of the step before
		}
		step(c, bc, func(p pair) backend.Weight { return p.c }, none)
		step(g, bg, func(p pair) backend.Weight { return p.g }, check)
	}
	for _, r := range []struct {
		name   string
		gc, gg backend.Buffer
	}{{"x", bc.x, bg.x}, {"up", bc.up, bg.up}, {"gate", bc.gate, bg.gate}, {"o", bc.o, bg.o}, {"k", bc.k, bg.k}, {"v", bc.v, bg.v}} {
		want := make([]float32, r.gc.Len())
		c.Read(want, r.gc, 0)
		if e := relErr(fromGPU(t, g, r.gg), want); e > matmulTol {
			t.Errorf("%s: relative error %.3g", r.name, e)
		}
	}
}

type gemm16W struct {
	*Weight
	biasHost []float32
}

// gemm16Weight uploads a random n x k weight in bf16 or f16 (as the GEMM
// reads it; Upload widens f16 to f32) with a bias, and returns its values.
func gemm16Weight(t *testing.T, g *Backend, rng *rand.Rand, n, k int, f16 bool) (gemm16W, []float32) {
	v := randn(rng, n*k)
	data := make([]byte, 2*len(v))
	for i, x := range v {
		var c uint16
		if f16 {
			c = quant.Float32ToF16(x)
		} else {
			c = quant.Float32ToBF16(x)
		}
		binary.LittleEndian.PutUint16(data[2*i:], c)
	}
	if f16 {
		quant.DecodeF16(v, data)
	} else {
		quant.DecodeBF16(v, data)
	}
	bias := randn(rng, n)
	w := &Weight{rows: n, cols: k, format: backend.BF16}
	var err error
	if w.data, err = g.upload(data); err == nil {
		w.bias, err = g.upload(f32Bytes(bias))
	}
	if err != nil {
		t.Fatal(err)
	}
	return gemm16W{w, bias}, v
}

// BenchmarkBF16GEMM times the bf16 matmul at the dense matrix's linear
// shapes (Llama-3-8B's 4096/14336 and 1024 rows, Qwen3-8B's 12288 FFN and
// 151936-row head) over m = 1 (the default gemv_bf16 or gemv_bf16_u4, and
// gemv_bf16_pf; each also with programmatic dependent launch, -pdl, where a
// launch overlaps the previous one's end as in a decode step), 5 and 16
// (the GEMM's 16-token tile), 64 and 512 (a prefill chunk): time_us, TFLOPS
// and the weight bytes a second against the copy bandwidth (of_copy; the
// figure of merit at m = 1 and small m). Weights rotate through copies so
// that no launch finds its weights in L2. dev/torch/bench_torch.py times
// cuBLAS at the same shapes.
func BenchmarkBF16GEMM(b *testing.B) {
	g, copyBW := benchGPU(b, false)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", copyBW/1e9)
	rng := rand.New(rand.NewPCG(3, 3))
	for _, shape := range [][2]int{{4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {12288, 4096}, {4096, 12288}, {151936, 4096}} {
		N, K := shape[0], shape[1]
		bf := repeatMiB(make([]byte, 2*N*K), func() byte { return byte(rng.Uint32() & 0x3f) }) // small finite bf16 values
		h := &backend.HostWeight{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf}
		bytes := float64(2 * N * K)
		var ws []backend.Weight
		type run struct {
			name   string
			m      int
			kernel string // force.bf16Kernel
			pdl    bool
		}
		runs := []run{{"bf16", 1, "", false}, {"bf16-pdl", 1, "", true}, {"bf16-pf", 1, "gemv_bf16_pf", false}, {"bf16-pf-pdl", 1, "gemv_bf16_pf", true}}
		for _, m := range []int{5, 16, 64, 512} {
			runs = append(runs, run{"bf16", m, "", false})
		}
		for _, v := range runs {
			m := v.m
			b.Run(fmt.Sprintf("%s/%dx%d/m=%d", v.name, N, K, m), func(b *testing.B) {
				g.force.bf16Kernel = v.kernel
				g.SetPDL(v.pdl)
				defer func() { g.force.bf16Kernel = ""; g.SetPDL(false) }()
				runtime.GC()
				ws = weightCopies(b, g, h, ws, bytes)
				d, _ := timeMatMul(g, ws, rng, m, N, K)
				if err := g.Sync(); err != nil {
					b.Fatal(err)
				}
				us, tflops := float64(d.Nanoseconds())/1e3, 2*float64(m)*float64(N)*float64(K)/d.Seconds()/1e12
				b.ReportMetric(us, "us/op")
				b.ReportMetric(tflops, "TFLOPS")
				fmt.Printf("RESULT bf16_gemm %s N=%d K=%d m=%d time_us=%.2f TFLOPS=%.1f of_copy=%.3f\n", v.name, N, K, m, us, tflops, bytes/d.Seconds()/copyBW)
			})
		}
		ws = nil
	}
}

// BenchmarkBF16Block times a Llama-3-8B-shape block's bf16 matvecs at m = 1
// as a decode step queues them, chained with programmatic dependent launch:
// q, k, v of one row; the output projection and its residual add; gate and
// up with their SwiGLU; the down projection and its residual add (436 MB of
// weights, rotated through two copies so that none is found in L2). joined
// is the default path (four launches: gemv_bf16_grp, gemv_bf16_glu);
// separate forces gemv_bf16 on each matvec, with the SwiGLU and the adds
// their own launches (nine), as before the joins. RESULT bf16_block: time
// and the weight bytes a second against the copy bandwidth.
func BenchmarkBF16Block(b *testing.B) {
	g, copyBW := benchGPU(b, true)
	rng := rand.New(rand.NewPCG(4, 4))
	const hidden, q, kv, ffn = 4096, 4096, 1024, 14336
	upload := func(n, k int) backend.Weight {
		bf := repeatMiB(make([]byte, 2*n*k), func() byte { return byte(rng.Uint32() & 0x3f) }) // small finite bf16 values
		w, err := g.Upload(&backend.HostWeight{Name: "bf16", Rows: n, Cols: k, Format: backend.BF16, Data: bf})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	type set struct{ wq, wk, wv, wo, gate, up, down backend.Weight }
	sets := make([]set, 2)
	for i := range sets {
		sets[i] = set{upload(q, hidden), upload(kv, hidden), upload(kv, hidden), upload(hidden, q), upload(ffn, hidden), upload(ffn, hidden), upload(hidden, ffn)}
	}
	bytes := 2 * float64(hidden*(q+2*kv)+q*hidden+3*hidden*ffn)
	nb := g.NewBuffer
	x, h, qb, kb, vb, gate, up := nb(hidden), nb(hidden), nb(q), nb(kv), nb(kv), nb(ffn), nb(ffn)
	g.Write(x, 0, randn(rng, hidden))
	g.Write(qb, 0, randn(rng, q))
	block := func(i int) {
		s := sets[i%len(sets)]
		g.MatMul(qb, x, s.wq, 1)
		g.MatMul(kb, x, s.wk, 1)
		g.MatMul(vb, x, s.wv, 1)
		g.MatMul(h, qb, s.wo, 1) // q stands in for the attention output
		g.Add(x, x, h)
		g.MatMul(gate, x, s.gate, 1)
		g.MatMul(up, x, s.up, 1)
		g.SwiGLU(gate, gate, up, 0)
		g.MatMul(h, gate, s.down, 1)
		g.Add(x, x, h)
	}
	for _, v := range []struct{ name, kernel string }{{"joined", ""}, {"separate", "gemv_bf16"}} {
		b.Run(v.name, func(b *testing.B) {
			g.force.bf16Kernel = v.kernel
			defer func() { g.force.bf16Kernel = "" }()
			timeBlocks(b, g, len(sets), 20, block, bytes, copyBW, "bf16_block "+v.name)
		})
	}
}
