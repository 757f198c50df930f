package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
)

// TestCublasOptions holds the cuBLAS thresholds' defaults and off values
// (no GPU needed).
func TestCublasOptions(t *testing.T) {
	for _, tc := range []struct {
		o          Options
		bf16, fp4  int
		invalidErr bool
	}{
		{Options{}, cublasMinMDefault, cublasNVFP4MinMDefault, false},
		{Options{NoCuBLAS: true, CuBLASMinM: 100}, 0, 0, false},
		{Options{CuBLASMinM: -1}, 0, cublasNVFP4MinMDefault, false},
		{Options{CuBLASMinM: 128, CuBLASNVFP4MinM: -1}, 128, 0, false},
		{Options{CuBLASNVFP4MinM: 2048}, cublasMinMDefault, 2048, false},
		{Options{CuBLASMinM: 1}, 0, 0, true},
	} {
		if err := tc.o.Validate(); (err != nil) != tc.invalidErr {
			t.Errorf("%+v: Validate %v", tc.o, err)
			continue
		}
		if tc.invalidErr {
			continue
		}
		if b, f := tc.o.cublasMinM(), tc.o.cublasNVFP4MinM(); b != tc.bf16 || f != tc.fp4 {
			t.Errorf("%+v: thresholds %d, %d, want %d, %d", tc.o, b, f, tc.bf16, tc.fp4)
		}
	}
	for _, c := range cublasCandidates() {
		if !strings.Contains(c[1], "libcublas.so") {
			t.Errorf("candidate %q", c[1])
		}
	}
}

// blasGPU is a GPU backend with cuBLAS loaded, or skips the test saying why.
func blasGPU(t testing.TB) *Backend {
	g := newGPU(t)
	if g.blas.handle == 0 {
		t.Skip("cuBLAS not in use: " + g.GEMMEngine())
	}
	t.Log(g.Name())
	return g
}

// TestCublasGEMM runs the cuBLAS paths against the own GEMM on the same
// operands and a reference, at shapes not multiples of any tile (odd m and
// N), one subtest a format:
//
//   - gemm16: bf16 and f16 weights with a bias (x as two halves: one
//     cublasGemmEx over both and blas_add_halves, and two cublasGemmEx),
//     against float64 sums of the decoded weights and the float32 x
//     (TestGemm16's bound: 1e-4) and the own GEMM (both sum the same
//     products in float32: far under 1e-5);
//   - nvfp4: NVFP4 weights (the weight dequantized to fp16, x rounded to
//     fp16, the global scale as alpha), with and without a bias, whole and in
//     chunks of rows (a partial last chunk, an odd chunk), against the own
//     NVFP4 GEMM on the GPU (the same fp16 operands and float32 sums: 1e-5)
//     and the CPU reference (TestMatMul's NVFP4 bound, 1e-3).
func TestCublasGEMM(t *testing.T) {
	g, c := blasGPU(t), refCPU()
	type shape struct{ m, n, k int }
	// gemms: the reference, the own GEMM and the cuBLAS path of one weight.
	type gemms struct {
		want      func(x []float32, m int) []float32
		own, blas func(out, x *Buffer, m int)
	}
	type check struct {
		against string
		tol     float64
		ref     bool // against the own GEMM (else the reference)
	}
	for _, tc := range []struct {
		name   string
		seed   [2]uint64
		shapes []shape
		knobs  []int // the values of *force, the cuBLAS path's variants
		force  *int
		checks []check
		label  func(opt bool, sh shape, knob int) string      // a case in messages
		weight func(rng *rand.Rand, n, k int, opt bool) gemms // opt: f16 or bias
	}{
		{
			name: "gemm16", seed: [2]uint64{5, 11},
			shapes: []shape{{2, 1000, 8}, {5, 130, 200}, {64, 4096, 512}, {65, 77, 384}, {100, 300, 776}, {513, 129, 136}, {1031, 257, 1032}},
			knobs:  []int{1, 2}, force: &g.force.blasStacked, // stacked, two GEMMs
			checks: []check{{"float64", 1e-4, false}, {"the own GEMM", 1e-5, true}},
			label: func(f16 bool, sh shape, mode int) string {
				return fmt.Sprintf("f16 %v, %+v, mode %d", f16, sh, mode)
			},
			weight: func(rng *rand.Rand, n, k int, f16 bool) gemms {
				w, vals := gemm16Weight(t, g, rng, n, k, f16)
				return gemms{
					want: func(x []float32, m int) []float32 { return gemm16Want(x, vals, w.biasHost, m, n, k) },
					own:  func(out, x *Buffer, m int) { g.gemm16(out, x, w.Weight, m, f16) },
					blas: func(out, x *Buffer, m int) { g.gemmBLAS16(out, x, w.Weight, m, f16) },
				}
			},
		},
		{
			name: "nvfp4", seed: [2]uint64{6, 13},
			shapes: []shape{{2, 300, 128}, {7, 1000, 2048}, {64, 300, 256}, {100, 129, 4096}, {513, 257, 640}, {1030, 390, 1024}},
			knobs:  []int{0, 128, 77}, force: &g.force.blasChunk,
			checks: []check{{"the own GEMM", 1e-5, true}, {"the CPU", 1e-3, false}},
			label: func(bias bool, sh shape, chunk int) string {
				return fmt.Sprintf("%+v, bias %v, chunk %d", sh, bias, chunk)
			},
			weight: func(rng *rand.Rand, n, k int, bias bool) gemms {
				h := hostWeight(rng, backend.NVFP4, n, k)
				if !bias {
					h.Bias = nil
				}
				wc, wg := uploadBoth(t, g, c, h)
				return gemms{
					want: func(x []float32, m int) []float32 {
						want := make([]float32, m*n)
						c.MatMul(cpu.Buffer(want), cpu.Buffer(x), wc, m)
						return want
					},
					own:  func(out, x *Buffer, m int) { g.gemmNVFP4(out, x, wg.(*Weight), m) },
					blas: func(out, x *Buffer, m int) { g.gemmBLASNVFP4(out, x, wg.(*Weight), m) },
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(tc.seed[0], tc.seed[1]))
			for _, sh := range tc.shapes {
				for _, opt := range []bool{false, true} {
					w := tc.weight(rng, sh.n, sh.k, opt)
					x := randn(rng, sh.m*sh.k)
					xg := toGPU(g, x).(*Buffer)
					want := w.want(x, sh.m)
					own := g.NewBuffer(sh.m * sh.n)
					w.own(own.(*Buffer), xg, sh.m)
					ref := fromGPU(t, g, own)
					for _, knob := range tc.knobs {
						*tc.force = knob
						out := g.NewBuffer(sh.m * sh.n)
						w.blas(out.(*Buffer), xg, sh.m)
						got := fromGPU(t, g, out)
						for _, ck := range tc.checks {
							against := want
							if ck.ref {
								against = ref
							}
							if e := relErr(got, against); e > ck.tol {
								t.Errorf("%s: relative error %.3g against %s", tc.label(opt, sh, knob), e, ck.against)
							}
						}
					}
					*tc.force = 0
				}
			}
		})
	}
}

// TestCublasMatMulRoutes checks that MatMul takes cuBLAS from the
// thresholds on (profiled: cublasGemmEx among the launches) and the own
// kernels below, that blasOff keeps them, and that a queue holding a cuBLAS
// call is not captured as a graph while the results stay those of a
// direct launch (GraphsOn, the same prefill queued three times).
func TestCublasMatMulRoutes(t *testing.T) {
	g := blasGPU(t)
	rng := rand.New(rand.NewPCG(7, 17))
	const n, k = 320, 512
	up := func(h *backend.HostWeight) backend.Weight {
		w, err := g.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	// wb: k -> n (bf16), wn: k -> n and wn2: n -> k (NVFP4).
	wb, wn, wn2 := up(hostWeight(rng, backend.BF16, n, k)), up(hostWeight(rng, backend.NVFP4, n, k)), up(hostWeight(rng, backend.NVFP4, k, n))
	launched := func(w backend.Weight, m int) bool {
		x, y := toGPU(g, randn(rng, m*k)), g.NewBuffer(m*n)
		g.StartProfile()
		g.MatMul(y, x, w, m)
		for _, kt := range g.StopProfile() {
			if kt.Name == "cublasGemmEx" {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		w    backend.Weight
		m    int
		off  bool
		want bool
	}{
		{wb, g.blas.minM, false, g.blas.minM > 0}, {wb, max(g.blas.minM-1, 1), false, false}, {wb, 1, false, false},
		{wb, max(g.blas.minM, 2), true, false},
		{wn, g.blas.nvfp4MinM, false, g.blas.nvfp4MinM > 0}, {wn, max(g.blas.nvfp4MinM-1, 1), false, false},
		{wn, max(g.blas.nvfp4MinM, 2), true, false},
	} {
		if tc.m < 1 {
			continue
		}
		g.force.blasOff = tc.off
		if got := launched(tc.w, tc.m); got != tc.want {
			t.Errorf("%v weight, m = %d, blasOff %v: cuBLAS launched %v, want %v", tc.w.(*Weight).format, tc.m, tc.off, got, tc.want)
		}
	}
	g.force.blasOff = false

	g.SetGraphs(GraphsOn)
	defer g.SetGraphs(GraphsAuto)
	g.force.blasAll = true
	defer func() { g.force.blasAll = false }()
	const m = 70
	x := toGPU(g, randn(rng, m*k))
	h, y := g.NewBuffer(m*n), g.NewBuffer(m*k)
	var first []float32
	before := g.GraphLaunches()
	for i := range 3 {
		for range 4 { // enough operations for a graph (minGraphOps)
			g.MatMul(h, x, wb, m)
			g.MatMul(y, h, wn2, m)
		}
		got := fromGPU(t, g, y)
		if i == 0 {
			first = got
		} else if e := relErr(got, first); e != 0 {
			t.Errorf("queue %d: relative error %.3g against the first", i, e)
		}
	}
	if d := g.GraphLaunches() - before; d != 0 {
		t.Errorf("%d queues holding cuBLAS calls were launched as graphs", d)
	}
	runtime.KeepAlive(wb)
	runtime.KeepAlive(wn)
	runtime.KeepAlive(wn2)
}

// BenchmarkCuBLASGEMM times the prefill matmuls at Llama-3-8B's FFN shapes
// (4096 x 14336 and 14336 x 4096) over m = 64 .. 8192: bf16-own (gemm16,
// x as two halves), bf16-cublas (the default path from CuBLASMinM: x's
// halves split, then by m one GEMM over both and blas_add_halves, or two),
// bf16-cublas-stacked and bf16-cublas-2gemm (each of those forced),
// bf16-cublas-1 (one cublasGemmEx on x
// already in bf16, float32 out: what cuBLAS bf16 alone takes, the F.linear
// reference), nvfp4-own (gemm_nvfp4_*), nvfp4-cublas (the weight
// dequantized to fp16 whole, x to fp16, one cublasGemmEx). Weights rotated
// through copies of 200 MB (weightCopies). RESULT cublas_gemm lines: time
// and TFLOPS (2 m N K a matmul).
func BenchmarkCuBLASGEMM(b *testing.B) {
	g, _ := benchGPU(b, false)
	if g.blas.handle == 0 {
		b.Skip("cuBLAS not in use: " + g.GEMMEngine())
	}
	fmt.Printf("RESULT cublas_engine %q\n", g.GEMMEngine())
	rng := rand.New(rand.NewPCG(8, 8))
	for _, shape := range [][2]int{{4096, 14336}, {14336, 4096}} {
		N, K := shape[0], shape[1]
		bf := repeatMiB(make([]byte, 2*N*K), func() byte { return byte(rng.Uint32() & 0x3f) }) // small finite bf16 values
		hb := &backend.HostWeight{Name: "bf16", Rows: N, Cols: K, Format: backend.BF16, Data: bf}
		hn := &backend.HostWeight{Name: "nvfp4", Rows: N, Cols: K, Format: backend.NVFP4, Q: randomNVFP4(rng, N, K)}
		var wsb, wsn []backend.Weight
		for _, v := range []struct {
			name string
			nv   bool
			set  func()
		}{
			{"bf16-own", false, func() { g.force.blasOff = true }},
			{"bf16-cublas", false, func() { g.force.blasAll = true }},
			{"bf16-cublas-stacked", false, func() { g.force.blasAll, g.force.blasStacked = true, 1 }},
			{"bf16-cublas-2gemm", false, func() { g.force.blasAll, g.force.blasStacked = true, 2 }},
			{"bf16-cublas-1", false, nil},
			{"nvfp4-own", true, func() { g.force.blasOff = true }},
			{"nvfp4-cublas", true, func() { g.force.blasAll = true }},
		} {
			for _, m := range []int{64, 128, 512, 2048, 8192} {
				b.Run(fmt.Sprintf("%s/%dx%d/m=%d", v.name, N, K, m), func(b *testing.B) {
					defer func() { g.force.blasOff, g.force.blasAll, g.force.blasStacked = false, false, 0 }()
					runtime.GC()
					h, ws, bytes := hb, &wsb, float64(2*N*K)
					if v.nv {
						h, ws, bytes = hn, &wsn, float64(N*K)*backend.NVFP4.BytesPerValue()
					}
					*ws = weightCopies(b, g, h, *ws, bytes)
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
					var us float64
					if v.set != nil {
						v.set()
						d, _ := timeMatMul(g, *ws, rng, m, N, K)
						us = float64(d.Nanoseconds()) / 1e3
					} else {
						us = timeGemmEx1(g, *ws, rng, m, N, K)
					}
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
					tflops := 2 * float64(m) * float64(N) * float64(K) / us / 1e6
					b.ReportMetric(us, "us/op")
					b.ReportMetric(tflops, "TFLOPS")
					fmt.Printf("RESULT cublas_gemm %s N=%d K=%d m=%d time_us=%.2f TFLOPS=%.1f\n", v.name, N, K, m, us, tflops)
				})
			}
		}
	}
}

// timeGemmEx1 times one cublasGemmEx of bf16 weights ws (in turn) by x of m
// rows already in bf16, float32 out: the device time of one, in us.
func timeGemmEx1(g *Backend, ws []backend.Weight, rng *rand.Rand, m, N, K int) float64 {
	x, y := g.NewBuffer(m*K), g.NewBuffer(m*N)
	g.Write(x, 0, randn(rng, m*K))
	x16 := g.NewBuffer(m * K) // hi and lo halves: m K words
	units := m * K / 8
	g.launch("gemm16_x_bf16", g.elementGrid(units), 256, 0, x16.(*Buffer).ptr, x.(*Buffer).ptr, units)
	one := func(w backend.Weight) {
		g.queueGemmEx(w.(*Weight).data.ptr, cudaR16BF, x16.(*Buffer).ptr, cudaR16BF, y.(*Buffer).ptr, N, m, K, N, 1, 0)
	}
	for _, w := range ws {
		one(w)
	}
	i := 0
	d := deviceTime(g, 50, func() { i++; one(ws[i%len(ws)]) })
	runtime.KeepAlive(x16)
	runtime.KeepAlive(y)
	return float64(d.Nanoseconds()) / 1e3
}

// TestGemmExLayout runs the cublasGemmEx calls that gemmBLAS16 and
// gemmBLASNVFP4 queue (gemmExOp, read back through gemmEx as launchBLAS
// passes them) through a host model of cuBLAS's column-major semantics,
// and checks that they compute the row-major y[m, N] = x[m, K]·W[N, K]ᵀ
// (+ bias through beta), whole and in chunks of feature rows, at odd sizes
// (no GPU needed: it checks the layout argument of cublas.go's comment).
func TestGemmExLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 19))
	const m, N, K = 5, 13, 24
	type region struct {
		base  uint64
		esize int
		v     []float32
	}
	var mem []*region
	alloc := func(base uint64, esize int, v []float32) *region {
		r := &region{base, esize, v}
		mem = append(mem, r)
		return r
	}
	at := func(addr uint64, esize int) *float32 {
		for _, r := range mem {
			if addr >= r.base && addr < r.base+uint64(r.esize*len(r.v)) && r.esize == esize {
				return &r.v[(addr-r.base)/uint64(esize)]
			}
		}
		t.Fatalf("address %#x (%d-byte elements) outside every buffer", addr, esize)
		return nil
	}
	size := func(typ int32) int {
		if typ == cudaR32F {
			return 4
		}
		return 2
	}
	// cublasGemmEx on the host: column-major, op(A) = Aᵀ when transa is T.
	gemm := func(o op) {
		g := o.gemmEx()
		if g.transa != cublasOpT || g.transb != cublasOpN {
			t.Fatalf("transa %d, transb %d", g.transa, g.transb)
		}
		ea, eb, ec := size(g.atype), size(g.btype), size(g.ctype)
		for j := range int(g.n) {
			for i := range int(g.m) {
				var s float64
				for k := range int(g.k) {
					a := *at(g.a+uint64(ea*(k+i*int(g.lda))), ea) // A(k, i): op(A)(i, k)
					b := *at(g.b+uint64(eb*(k+j*int(g.ldb))), eb)
					s += float64(a) * float64(b)
				}
				c := at(g.c+uint64(ec*(i+j*int(g.ldc))), ec)
				*c = float32(float64(g.alpha)*s + float64(g.beta)*float64(*c))
			}
		}
	}
	W, x, bias := randn(rng, N*K), randn(rng, m*K), randn(rng, N)
	want := make([]float32, m*N)
	for i := range m {
		for r := range N {
			var s float64
			for k := range K {
				s += float64(x[i*K+k]) * float64(W[r*K+k])
			}
			want[i*N+r] = float32(0.5*s) + bias[r]
		}
	}
	const wa, xa, ya = 0x10000, 0x20000, 0x30000
	alloc(wa, 2, W)
	alloc(xa, 2, x)
	for _, rows := range []int{N, 4, 7} {
		y := make([]float32, m*N)
		for i := range m {
			copy(y[i*N:], bias) // blas_bias_rows
		}
		alloc(ya, 4, y)
		for n0 := 0; n0 < N; n0 += rows {
			r := min(rows, N-n0)
			gemm(gemmExOp(wa+uint64(2*n0*K), cudaR16F, xa, cudaR16F, ya+uint64(4*n0), r, m, K, N, 0.5, 1))
		}
		if e := relErr(y, want); e > 1e-6 {
			t.Errorf("chunks of %d rows: relative error %.3g", rows, e)
		}
		mem = mem[:2]
	}
	// Stacked (gemmBLAS16 below blasStackedMaxM): x's hi and lo rows one
	// row-major 2m x K matrix, one GEMM over 2m into c[2m, N], then
	// blas_add_halves.
	hi, lo := make([]float32, m*K), make([]float32, m*K)
	for i, v := range x {
		hi[i] = float32(float64(v) * 0.75)
		lo[i] = v - hi[i]
	}
	mem = mem[:1]
	alloc(xa, 2, append(hi, lo...))
	c := make([]float32, 2*m*N)
	alloc(ya, 4, c)
	gemm(gemmExOp(wa, cudaR16BF, xa, cudaR16BF, ya, N, 2*m, K, N, 0.5, 0))
	y := make([]float32, m*N)
	for i := range y {
		y[i] = c[i] + c[m*N+i] + bias[i%N]
	}
	if e := relErr(y, want); e > 1e-6 {
		t.Errorf("stacked halves: relative error %.3g", e)
	}
}
