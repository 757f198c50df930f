package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/conformance"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/layers/dsv4"
	"github.com/manifoldlm/manifold/quant"
)

// fp8Weight is a random rows x cols FP8 weight with 128x128 tiles of
// scale type sd.
func fp8Weight(t testing.TB, rng *rand.Rand, rows, cols int, sd quant.ScaleDType, bias bool) *backend.HostWeight {
	t.Helper()
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(cols)))
	}
	q, err := quant.QuantizeFP8Block(v, rows, cols, 128, 128, sd)
	if err != nil {
		t.Fatal(err)
	}
	h := &backend.HostWeight{Name: "w", Rows: rows, Cols: cols, Format: backend.FP8Block, FP8: q}
	if bias {
		h.Bias = randn(rng, rows)
	}
	return h
}

// TestFP8MatMul holds the FP8 kernels (fp8.cuh) to the CPU backend, each
// forced at every m: the CUDA-core GEMV (float32, exact up to the order of
// the sums: float32's tolerance, 2e-5), the tensor-core GEMM (x rounded to
// fp16: 4e-3), the bulk-copy GEMV gemv_fp8_tma (m = 1; float32, 2e-5; the
// default rules at other m) and the default choice; E8M0 and float32 scales; shapes off
// every tile; x at an offset that is not 16-byte aligned (gemv_fp8_any).
func TestFP8MatMul(t *testing.T) {
	g := newGPU(t)
	c := cpu.New(2)
	rng := rand.New(rand.NewPCG(58, 8))
	for _, k := range []struct {
		name  string
		force int
		tol   float64
	}{{"default", 0, 4e-3}, {"gemv", fp8ForceGEMV, 2e-5}, {"gemm", fp8ForceGEMM, 4e-3}, {"tma", fp8ForceTMA, 2e-5}} {
		for _, sd := range []quant.ScaleDType{quant.ScaleE8M0, quant.ScaleF32} {
			for _, s := range []struct {
				m, N, K int
				bias    bool
				off     int
			}{
				{1, 7, 64, false, 0}, {1, 257, 2048, true, 0}, {1, 300, 7168, false, 0}, {2, 129, 7168, false, 0},
				{3, 130, 320, true, 0}, {4, 513, 1024, false, 0}, {5, 200, 272, false, 0}, {16, 64, 7168, false, 0},
				{17, 130, 400, true, 0}, {64, 256, 1024, false, 0}, {100, 384, 2176, true, 0}, {512, 200, 272, false, 0},
				{3, 96, 256, false, 1}, {1, 96, 256, false, 3},
				// gemv_fp8_tma's ring: a 16-byte last stage, more tiles than
				// multiprocessors, K = 18432 (x takes 72 KB of its shared memory).
				{1, 1000, 2064, true, 0}, {1, 4100, 1024, false, 0}, {1, 33, 18432, true, 0},
			} {
				t.Run(fmt.Sprintf("%s/%s/m=%d/%dx%d/bias=%v/off=%d", k.name, sd, s.m, s.N, s.K, s.bias, s.off), func(t *testing.T) {
					g.force.fp8 = k.force
					defer func() { g.force.fp8 = 0 }()
					h := fp8Weight(t, rng, s.N, s.K, sd, s.bias)
					x := randn(rng, s.off+s.m*s.K)
					wg, err := g.Upload(h)
					if err != nil {
						t.Fatal(err)
					}
					if wg.(*Weight).format != backend.FP8Block {
						t.Fatalf("uploaded as %s, want fp8block", wg.(*Weight).format)
					}
					wc, err := c.Upload(h)
					if err != nil {
						t.Fatal(err)
					}
					xb := g.NewBuffer(len(x))
					g.Write(xb, 0, x)
					y := g.NewBuffer(s.m * s.N)
					g.MatMul(y, g.View(xb, s.off, s.m*s.K), wg, s.m)
					got := make([]float32, s.m*s.N)
					g.Read(got, y, 0)
					if err := g.Sync(); err != nil {
						t.Fatal(err)
					}
					want := make(cpu.Buffer, s.m*s.N)
					c.MatMul(want, cpu.Buffer(x[s.off:]), wc, s.m)
					tol := k.tol
					if k.force == fp8ForceTMA && s.m > 1 {
						tol = 4e-3 // the default rules: the tensor-core GEMM from m = 2
					}
					if err := conformance.Compare(got, want, tol); err != nil {
						t.Error(err)
					}
				})
			}
		}
	}
}

// TestFP8MLA holds MLA's absorb and expand (weight_at, dsa.cuh) on an FP8
// kv_b_proj, as DeepSeek-V3 stores it, to the CPU backend.
func TestFP8MLA(t *testing.T) {
	g := newGPU(t)
	c := cpu.New(2)
	rng := rand.New(rand.NewPCG(58, 9))
	s := layers.MLAShape{Heads: 3, KVLoraRank: 200, NopeDim: 32, RopeDim: 16, VDim: 48}
	m := 2
	for _, sd := range []quant.ScaleDType{quant.ScaleE8M0, quant.ScaleF32} {
		h := fp8Weight(t, rng, s.Heads*(s.NopeDim+s.VDim), s.KVLoraRank, sd, false)
		wc, wg := uploadBoth(t, g, c, h)
		q, ol := randn(rng, m*s.Heads*s.QKDim()), randn(rng, m*s.Heads*s.KVLoraRank)
		qg, olg := g.NewBuffer(len(q)), g.NewBuffer(len(ol))
		g.Write(qg, 0, q)
		g.Write(olg, 0, ol)
		lat, out := g.NewBuffer(m*s.Heads*s.KVLoraRank), g.NewBuffer(m*s.Heads*s.VDim)
		g.MLAAbsorbQuery(lat, qg, wg, m, s)
		g.MLAExpandOutput(out, olg, wg, m, s)
		gl, gout := make([]float32, lat.Len()), make([]float32, out.Len())
		g.Read(gl, lat, 0)
		g.Read(gout, out, 0)
		if err := g.Sync(); err != nil {
			t.Fatal(err)
		}
		cl, cout := make(cpu.Buffer, len(gl)), make(cpu.Buffer, len(gout))
		c.MLAAbsorbQuery(cl, cpu.Buffer(q), wc, m, s)
		c.MLAExpandOutput(cout, cpu.Buffer(ol), wc, m, s)
		if err := conformance.Compare(gl, cl, 1e-5); err != nil {
			t.Errorf("%s: absorb: %v", sd, err)
		}
		if err := conformance.Compare(gout, cout, 1e-5); err != nil {
			t.Errorf("%s: expand: %v", sd, err)
		}
	}
}

// BenchmarkFP8GEMV times the FP8 block-scaled matmuls at DeepSeek-V3's and
// V4-Flash's shapes (7168 and 4096 wide) against the copy bandwidth measured
// in the same run, in effective bytes (one a weight plus the float32 tile
// scales): fp8 the default choice, fp8-gemv the CUDA-core GEMV and fp8-gemm
// the tensor-core GEMM forced at every m (the measurement behind
// fp8GemvMaxM), fp8-widened the weight widened to bf16 at upload as before
// the FP8 kernels (the same bytes count for it: its rate in FP8 bytes, so
// the ratios compare time), fp8-tma the bulk-copy GEMV gemv_fp8_tma at m = 1
// (issue 58: the CUDA-core GEMV's 72% of copy against the 80% target). m =
// 512 is a prefill chunk. RESULT lines as BenchmarkGEMV's.
func BenchmarkFP8GEMV(b *testing.B) {
	g, copyBW := benchGPU(b, false)
	fmt.Printf("RESULT copy copy_GBps=%.0f\n", copyBW/1e9)
	rng := rand.New(rand.NewPCG(58, 1))
	for _, shape := range [][2]int{{18432, 7168}, {7168, 18432}, {4096, 7168}, {24576, 1536}, {2048, 4096}, {4096, 2048}} {
		N, K := shape[0], shape[1]
		q := &quant.FP8Block{Rows: N, Cols: K, BlockRows: 128, BlockCols: 128, Data: make([]byte, N*K), ScaleDType: quant.ScaleE8M0}
		repeatMiB(q.Data, func() byte { return byte(rng.Uint32()) & 0xf7 }) // no NaN codes (0x7f, 0xff)
		sr, sc := q.ScaleShape()
		q.Scales = make([]byte, sr*sc)
		for i := range q.Scales {
			q.Scales[i] = byte(120 + rng.IntN(8))
		}
		h := &backend.HostWeight{Name: "fp8", Rows: N, Cols: K, Format: backend.FP8Block, FP8: q}
		bytes := float64(q.Bytes() - len(q.Scales) + 4*len(q.Scales)) // codes + float32 scales
		for _, v := range []struct {
			name  string
			force int
			ms    []int
		}{
			{"fp8", 0, []int{1, 2, 4, 8, 16, 64, 512}},
			{"fp8-gemv", fp8ForceGEMV, []int{1, 2, 3, 4, 8, 16}},
			{"fp8-gemm", fp8ForceGEMM, []int{1, 2, 4, 8, 16, 32, 64, 512}},
			{"fp8-widened", fp8Widen, []int{1, 4, 16, 64, 512}},
			{"fp8-tma", fp8ForceTMA, []int{1}},
		} {
			g.force.fp8 = v.force
			var ws []backend.Weight
			devBytes := bytes
			if v.force == fp8Widen {
				devBytes = float64(2 * N * K)
			}
			for _, m := range v.ms {
				b.Run(fmt.Sprintf("%s/%dx%d/m=%d", v.name, N, K, m), func(b *testing.B) {
					runtime.GC()
					// Copies of the weights, taken in turn, so that none is found in L2.
					ws = weightCopies(b, g, h, ws, devBytes)
					d, next := timeMatMul(g, ws, rng, m, N, K)
					hs := time.Now()
					for range 50 {
						next()
					}
					g.onContext(func() {})
					host := time.Since(hs) / 50
					b.ReportMetric(float64(d.Microseconds()), "us/op")
					b.ReportMetric(bytes/d.Seconds()/copyBW, "of-copy-bw")
					fmt.Printf("RESULT gemv %s N=%d K=%d m=%d time_us=%.2f weight_GBps=%.0f of_copy=%.3f tflops=%.1f host_us=%.2f\n", v.name, N, K, m,
						float64(d.Nanoseconds())/1e3, bytes/d.Seconds()/1e9, bytes/d.Seconds()/copyBW, 2*float64(m)*float64(N)*float64(K)/d.Seconds()/1e12,
						float64(host.Nanoseconds())/1e3)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
				})
			}
			g.force.fp8 = 0
		}
	}
}

// TestFP8GemvParams round-trips the joined FP8 GEMV's launch parameters
// (Fp8GemvArgs) and checks its grid: each weight's row pairs, 8 / kw a
// block. Needs no GPU.
func TestFP8GemvParams(t *testing.T) {
	g := fp8Gemv{w: [3]uint64{1, 2, 3}, s: [3]uint64{4, 5, 6}, y: [3]uint64{7, 8, 9}, bias: [3]uint64{0, 10, 0},
		x: 11, n: [3]int{1536, 576, 7}, k: 7168, m: 1, groups: 3, xs: 4096}
	for _, kw := range []int{1, 2, 8} {
		p, blocks := g.params(kw)
		per := 2 * (8 / kw)
		want := (1536+per-1)/per + (576+per-1)/per + (7+per-1)/per
		if blocks != want {
			t.Errorf("kw %d: %d blocks, want %d", kw, blocks, want)
		}
		back, ok := fp8GemvOf(p[:])
		if !ok || back != g {
			t.Errorf("kw %d: decoded %+v, want %+v", kw, back, g)
		}
		if ends := int(int32(uint32(p[15] >> 32))); ends != blocks {
			t.Errorf("kw %d: last group ends at block %d, want %d", kw, ends, blocks)
		}
		if got := int(int32(uint32(p[17]))); got != kw {
			t.Errorf("kw = %d in the parameters, want %d", got, kw)
		}
	}
}

// queuedFP8Groups is the number of weights of each gemv_fp8_m1 launch
// queued on g.
func queuedFP8Groups(g *Backend) []int {
	g.qmu.Lock()
	defer g.qmu.Unlock()
	var launches []int
	for _, o := range g.q.ops {
		if o.name == "gemv_fp8_m1" {
			p, _ := fp8GemvOf(o.params)
			launches = append(launches, p.groups)
		}
	}
	return launches
}

// TestFP8Join queues four m = 1 FP8 matmuls of one x (as DeepSeek-V3's
// q_a and kv_a projections): the first three join in one launch of
// gemv_fp8_m1, the fourth starts the next; each output is held to the CPU
// backend.
func TestFP8Join(t *testing.T) {
	g := newGPU(t)
	c := cpu.New(2)
	rng := rand.New(rand.NewPCG(58, 10))
	K := 7168
	hs := []*backend.HostWeight{fp8Weight(t, rng, 1536, K, quant.ScaleE8M0, false), fp8Weight(t, rng, 576, K, quant.ScaleF32, false),
		fp8Weight(t, rng, 7, K, quant.ScaleE8M0, true), fp8Weight(t, rng, 100, K, quant.ScaleE8M0, false)}
	xv := randn(rng, K)
	x := g.NewBuffer(K)
	g.Write(x, 0, xv)
	var ys []backend.Buffer
	var wgs, wcs []backend.Weight
	for _, h := range hs {
		wc, wg := uploadBoth(t, g, c, h)
		wgs, wcs = append(wgs, wg), append(wcs, wc)
		ys = append(ys, g.NewBuffer(h.Rows))
	}
	if err := g.Sync(); err != nil { // uploads and writes done: the queue starts empty
		t.Fatal(err)
	}
	for i := range hs {
		g.MatMul(ys[i], x, wgs[i], 1)
	}
	launches := queuedFP8Groups(g)
	if len(launches) != 2 || launches[0] != 3 || launches[1] != 1 {
		t.Errorf("queued gemv_fp8_m1 launches of %v weights, want [3 1]", launches)
	}
	for i, h := range hs {
		got := make([]float32, h.Rows)
		g.Read(got, ys[i], 0)
		want := make(cpu.Buffer, h.Rows)
		c.MatMul(want, cpu.Buffer(xv), wcs[i], 1)
		if err := conformance.Compare(got, want, 2e-5); err != nil {
			t.Errorf("weight %d (%d rows): %v", i, h.Rows, err)
		}
	}
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestFP8GroupMoE holds the device MoE over FP8 routed experts (moe_up_fp8,
// moe_down_fp8: DeepSeek-V3's, float32 tile scales; V4 -Base's, which the
// E8M0 case stands for) to the host path on the CPU backend, with V3's
// group routing and V4's, widths off the 128 tiles.
func TestFP8GroupMoE(t *testing.T) {
	g, c := newGPU(t), refCPU()
	rng := rand.New(rand.NewPCG(58, 11))
	for _, tc := range []struct {
		m, experts, k, dim, ffn int
		sd                      quant.ScaleDType
		group                   bool
	}{
		{1, 32, 6, 320, 160, quant.ScaleF32, true},
		{3, 16, 4, 256, 96, quant.ScaleE8M0, true},
		{2, 32, 6, 448, 224, quant.ScaleE8M0, false},
	} {
		name := fmt.Sprintf("fp8 moe m=%d top-%d of %d, dim %d, ffn %d, %s, group %v", tc.m, tc.k, tc.experts, tc.dim, tc.ffn, tc.sd, tc.group)
		var gw, cw [3][]backend.Weight
		for range tc.experts {
			for j, shape := range [][2]int{{tc.ffn, tc.dim}, {tc.ffn, tc.dim}, {tc.dim, tc.ffn}} {
				h := fp8Weight(t, rng, shape[0], shape[1], tc.sd, false)
				wc, wg := uploadBoth(t, g, c, h)
				gw[j], cw[j] = append(gw[j], wg), append(cw[j], wc)
			}
		}
		bias := randn(rng, tc.experts)
		x, logits, shared := randn(rng, tc.m*tc.dim), randn(rng, tc.m*tc.experts), randn(rng, tc.m*tc.dim)
		idx, w := make([]int32, tc.m*tc.k), make([]float32, tc.m*tc.k)
		ga := layers.GroupRouteArgs{M: tc.m, Experts: tc.experts, K: tc.k, Groups: 4, TopKGroups: 2, Normalize: true, Scale: 2.5}
		va := dsv4.RouteArgs{M: tc.m, Experts: tc.experts, K: tc.k, Scoring: dsv4.ScoreSqrtSoftplus, Scale: 1.5}
		if tc.group {
			layers.GroupRoute(idx, w, logits, bias, ga)
		} else {
			dsv4.Route(idx, w, logits, bias, nil, va)
		}
		want := append([]float32{}, shared...)
		moeHostAdd(c, cw, want, x, idx, w, tc.m, tc.k, tc.dim, tc.ffn, 0)
		ex, err := g.BindExperts(gw[0], gw[1], gw[2], bias)
		if err != nil || ex == nil {
			t.Fatalf("%s: BindExperts: %v, %v", name, ex, err)
		}
		if !ex.(*moeExperts).fp8 {
			t.Fatalf("%s: experts bound as NVFP4", name)
		}
		out := toGPU(g, shared)
		if tc.group {
			g.GroupMoE(out, toGPU(g, x), toGPU(g, logits), ex, ga)
		} else {
			g.RoutedMoE(out, toGPU(g, x), toGPU(g, logits), nil, ex, va, 0)
		}
		check(t, name, fromGPU(t, g, out), want, opsTol)
	}
}

// TestFP8JoinStrided queues DeepSeek-V4's grouped output projection at m =
// 1 (GroupedMatMul: weight j reads slice j of the row): the FP8 matmuls
// join three a launch, reading their rows at a stride, and each output is
// held to the CPU backend.
func TestFP8JoinStrided(t *testing.T) {
	g := newGPU(t)
	c := cpu.New(2)
	rng := rand.New(rand.NewPCG(58, 12))
	const G, rows, cols = 5, 200, 512
	var wgs, wcs []backend.Weight
	for range G {
		h := fp8Weight(t, rng, rows, cols, quant.ScaleE8M0, false)
		wc, wg := uploadBoth(t, g, c, h)
		wgs, wcs = append(wgs, wg), append(wcs, wc)
	}
	xv := randn(rng, G*cols)
	x, y := g.NewBuffer(G*cols), g.NewBuffer(G*rows)
	g.Write(x, 0, xv)
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	g.GroupedMatMul(y, x, wgs, 1)
	launches := queuedFP8Groups(g)
	if !slices.Equal(launches, []int{3, 2}) {
		t.Errorf("queued gemv_fp8_m1 launches of %v weights, want [3 2]", launches)
	}
	got := make([]float32, G*rows)
	g.Read(got, y, 0)
	if err := g.Sync(); err != nil {
		t.Fatal(err)
	}
	for j := range G {
		want := make(cpu.Buffer, rows)
		c.MatMul(want, cpu.Buffer(xv[j*cols:(j+1)*cols]), wcs[j], 1)
		if err := conformance.Compare(got[j*rows:(j+1)*rows], want, 2e-5); err != nil {
			t.Errorf("group %d: %v", j, err)
		}
	}
}
