package model

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// Issue 57: would the GPU's bf16-weight matmuls keep the acceptance bounds
// (logits within 2e-2 of the float32 CPU backend, greedy tokens equal) if x
// were rounded to bf16 once (one plain cuBLAS GEMM) instead of being split
// into two bf16 halves (hi + lo, two GEMMs)? Emulated on the CPU:
// roundingBackend wraps the float32 CPU backend and rounds the activation
// rows (round to nearest even) before every matmul of a bf16 weight. Test
// code only: the production backends are untouched.

// xRounding says which matmuls of bf16 weights get x rounded, and to what.
type xRounding struct {
	name  string
	round func(float32) float32
	// minM: only matmuls of at least minM rows (tokens) round x: 2 leaves
	// decode steps (m = 1, the GPU's gemv on float32 x) exact.
	minM int
	// kernels: also the backend's own fused products of bf16 weights
	// (MHCProject's matmul, MLAAbsorbQuery, MLAExpandOutput), which the GPU
	// runs in its own kernels on float32 x; off, only MatMul and
	// GroupedMatMul (the calls a cuBLAS GEMM would take) round.
	kernels bool
	// keepSelect leaves x exact for the weights whose outputs feed a
	// discrete choice: MoE routers (*.gate.weight) and DSA/V4 indexers
	// (*.indexer.*), where a flipped top-k moves logits by O(1).
	keepSelect bool
	// bound: the variant must stay within the fixtures' CPU bound (1e-3 of
	// transformers' logits, greedy tokens equal the unrounded path's).
	bound bool
}

// selects reports whether a weight (by checkpoint name) feeds a top-k
// selection: a MoE router or an indexer.
func selects(name string) bool {
	return strings.Contains(name, ".gate.weight") || strings.Contains(name, ".indexer.")
}

func roundBF16(v float32) float32 { return quant.BF16ToFloat32(quant.Float32ToBF16(v)) }
func roundF16(v float32) float32  { return quant.F16ToFloat32(quant.Float32ToF16(v)) }

// splitBF16 is x as today's GPU bf16 GEMMs see it: hi = bf16(x), lo =
// bf16(x - hi), both multiplied, so the product is the weight times hi + lo.
func splitBF16(v float32) float32 { hi := roundBF16(v); return hi + roundBF16(v-hi) }

var xRoundings = []xRounding{
	// Today's GPU path (kernels/cublas.go, bf16.cuh): x as two bf16 halves,
	// every product: held to the CPU bound.
	{name: "bf16x2-all", round: splitBF16, minM: 1, kernels: true, bound: true},
	// Every bf16-weight product, decode included: the worst case (PyTorch's
	// bf16 F.linear everywhere, activations between kept in float32).
	{name: "bf16-all", round: roundBF16, minM: 1, kernels: true},
	// The GEMM option: MatMul/GroupedMatMul of m >= 2 rows (prefill; the
	// GPU's gemm16 and cuBLAS range), decode and the fused kernels exact.
	{name: "bf16-gemm", round: roundBF16, minM: 2},
	// bf16-gemm from cuBLAS's default threshold (kernels.cublasMinMDefault
	// = 64 rows): the 96-token passes' dense matmuls only (not the MoE
	// experts' few rows each, nor the 37- and 20-token prefills).
	{name: "bf16-gemm64", round: roundBF16, minM: 64},
	// bf16-gemm with the routers' and indexers' matmuls exact.
	{name: "bf16-gemm-keepsel", round: roundBF16, minM: 2, keepSelect: true},
	// For reference: x in fp16 (10 explicit mantissa bits) with the bf16
	// weight, everywhere (cuBLAS would need the weights converted to fp16).
	{name: "f16-all", round: roundF16, minM: 1, kernels: true},
	{name: "f16-gemm", round: roundF16, minM: 2},
}

type roundingBackend struct {
	*cpu.Backend
	r     xRounding
	names map[backend.Weight]string // Upload's names, for keepSelect
}

func (b *roundingBackend) Upload(h *backend.HostWeight) (backend.Weight, error) {
	w, err := b.Backend.Upload(h)
	if err == nil {
		b.names[w] = h.Name
	}
	return w, err
}

// roundsFor reports whether x is rounded for a product of m rows with w.
func (b *roundingBackend) roundsFor(w backend.Weight, m int) bool {
	return w.Format() == backend.BF16 && m >= b.r.minM && !(b.r.keepSelect && selects(b.names[w]))
}

func (b *roundingBackend) rounded(x backend.Buffer, n int) cpu.Buffer {
	src := cpu.Data(x)[:n]
	out := make(cpu.Buffer, n)
	for i, v := range src {
		out[i] = b.r.round(v)
	}
	return out
}

func (b *roundingBackend) MatMul(dst, x backend.Buffer, w backend.Weight, m int) {
	if b.roundsFor(w, m) {
		x = b.rounded(x, m*w.Cols())
	}
	b.Backend.MatMul(dst, x, w, m)
}

func (b *roundingBackend) GroupedMatMul(dst, x backend.Buffer, ws []backend.Weight, m int) {
	if b.roundsFor(ws[0], m) {
		x = b.rounded(x, m*len(ws)*ws[0].Cols()) // elementwise: the same before or after the transpose
	}
	b.Backend.GroupedMatMul(dst, x, ws, m)
}

// MHCProject is backend/cpu's: the matmul of x (rounded when kernels is
// set), then each row scaled by 1/rms of the unrounded x.
func (b *roundingBackend) MHCProject(logits, x backend.Buffer, fn backend.Weight, rows int, normEps float32) {
	if !b.r.kernels || !b.roundsFor(fn, rows) {
		b.Backend.MHCProject(logits, x, fn, rows, normEps)
		return
	}
	b.MatMul(logits, x, fn, rows)
	l, xs := cpu.Data(logits), cpu.Data(x)
	width, mix := fn.Cols(), fn.Rows()
	for r := range rows {
		var ss float64
		for _, v := range xs[r*width : (r+1)*width] {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(width)+float64(normEps)))
		for i := range l[r*mix : (r+1)*mix] {
			l[r*mix+i] *= inv
		}
	}
}

func (b *roundingBackend) MLAAbsorbQuery(qLat, q backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	if b.r.kernels && b.roundsFor(kvB, m) {
		q = b.rounded(q, m*s.Heads*s.QKDim()) // the nope part is the matmul's x; the rope part is not read
	}
	b.Backend.MLAAbsorbQuery(qLat, q, kvB, m, s)
}

func (b *roundingBackend) MLAExpandOutput(out, outLat backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape) {
	if b.r.kernels && b.roundsFor(kvB, m) {
		outLat = b.rounded(outLat, m*s.Heads*s.KVLoraRank)
	}
	b.Backend.MLAExpandOutput(out, outLat, kvB, m, s)
}

// Interfaces of *cpu.Backend the models look for must survive the wrapping.
var (
	_ interface {
		MLAAbsorbQuery(qLat, q backend.Buffer, kvB backend.Weight, m int, s layers.MLAShape)
	} = (*roundingBackend)(nil)
)

// roundingRun is one model's outputs under one rounding (nil: none).
type roundingRun struct {
	full, incr []float32 // [T, V]; [T-P+1, V]
	greedy     []int32
	m          Model
}

func runForRounding(t *testing.T, dir string, r *xRounding, ids []int32, P int) roundingRun {
	t.Helper()
	var be backend.Backend = cpu.NewWithOptions(cpu.Options{ReferenceNVFP4: true})
	if r != nil {
		be = &roundingBackend{Backend: be.(*cpu.Backend), r: *r, names: map[backend.Weight]string{}}
	}
	f, m, err := Open(dir, be, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ctx := context.Background()
	out := roundingRun{m: m}
	T := len(ids)
	st, err := m.NewState(T)
	if err != nil {
		t.Fatal(err)
	}
	if out.full, err = m.Forward(ctx, st, ids, true); err != nil {
		t.Fatal(err)
	}
	if P > 0 {
		st, _ := m.NewState(T)
		last, err := m.Forward(ctx, st, ids[:P], false)
		if err != nil {
			t.Fatal(err)
		}
		out.incr = append(out.incr, last...)
		for p := P; p < T; p++ {
			if last, err = m.Forward(ctx, st, ids[p:p+1], false); err != nil {
				t.Fatal(err)
			}
			out.incr = append(out.incr, last...)
		}
	}
	out.greedy = greedyFrom(t, m, ids[:min(20, len(ids))], 24)
	return out
}

func greedyFrom(t *testing.T, m Model, prompt []int32, n int) []int32 {
	t.Helper()
	ctx := context.Background()
	st, err := m.NewState(len(prompt) + n)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward(ctx, st, prompt, false)
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for len(got) < n {
		got = append(got, argmax(logits))
		if len(got) == n {
			break
		}
		if logits, err = m.Forward(ctx, st, got[len(got)-1:], false); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// followsTokens feeds want (greedy tokens from prompt) through m and reports
// whether at each step want's token is within tol of m's best logit (the GPU
// golden tests' rule: near-ties may go either way), and the largest gap.
func followsTokens(t *testing.T, m Model, prompt, want []int32, tol float32) (bool, float32) {
	t.Helper()
	ctx := context.Background()
	st, _ := m.NewState(len(prompt) + len(want))
	logits, err := m.Forward(ctx, st, prompt, false)
	if err != nil {
		t.Fatal(err)
	}
	var gap float32
	for i, tok := range want {
		gap = max(gap, slices.Max(logits)-logits[tok])
		if i+1 < len(want) {
			if logits, err = m.Forward(ctx, st, []int32{tok}, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	return gap <= tol, gap
}

func leadingEqual(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// gpuGoldenTol and greedyTieTol are kernels' TestGoldenOnGPU bounds: the
// GPU's logits within 2e-2 of the CPU backend's, greedy tokens equal up to
// ties within 1e-4.
const (
	gpuGoldenTol = 2e-2
	greedyTieTol = 1e-4
)

// TestBF16ActivationRounding measures, on the bf16 golden checkpoints (and
// the built-in model's bf16 checkpoint), what rounding x to bf16 (or fp16)
// at the input of the bf16-weight matmuls does to the logits: against
// transformers' (float32 activations) and against the unrounded CPU path,
// full-prompt and incremental, and to greedy decoding. It logs the numbers;
// it asserts only that x as two bf16 halves (today's GPU bf16 GEMMs) stays
// within the CPU bound. x rounded to bf16 once does not keep the GPU bound
// (2e-2 of the CPU's logits): llama and qwen3 move by 0.033-0.034, the
// DeepSeek fixtures by 2-4.7 (flipped routing and top-k), so those
// variants are logged, not asserted.
func TestBF16ActivationRounding(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement: 4 fixtures x 4 runs")
	}
	root := golden.Dir(t)
	for _, arch := range []string{"llama", "qwen3", "deepseek_v32", "deepseek_v4"} {
		dir := filepath.Join(root, arch, "bf16")
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			t.Logf("%s: no bf16 fixture", arch)
			continue
		}
		t.Run(arch, func(t *testing.T) {
			ref := golden.Load(t, dir)
			P := 0 // the bf16 folder has logits_full only: P from the f32 fixture's incremental rows
			if f32 := golden.Load(t, filepath.Join(root, arch)); f32.LogitsIncremental != nil {
				P = len(f32.InputIDs) - f32.IncrementalRows + 1
			}
			V := ref.Vocab
			T := len(ref.InputIDs)
			refIncr := ref.LogitsFull[(P-1)*V : T*V] // incremental row i is full row P-1+i
			base := runForRounding(t, dir, nil, ref.InputIDs, P)
			t.Logf("%-9s full vs HF %.3g, incr(P=%d) vs HF %.3g, greedy %v", "none",
				maxAbsDiff(base.full, ref.LogitsFull), P, maxAbsDiff(base.incr, refIncr), base.greedy)
			for _, r := range xRoundings {
				got := runForRounding(t, dir, &r, ref.InputIDs, P)
				fullHF, fullCPU := maxAbsDiff(got.full, ref.LogitsFull), maxAbsDiff(got.full, base.full)
				incrHF, incrCPU := maxAbsDiff(got.incr, refIncr), maxAbsDiff(got.incr, base.incr)
				follows, gap := followsTokens(t, got.m, ref.InputIDs[:20], base.greedy, greedyTieTol)
				eq := slices.Equal(got.greedy, base.greedy)
				inGPU := max(fullCPU, incrCPU) <= gpuGoldenTol && follows
				t.Logf("%-9s full vs HF %.3g vs CPU %.3g | incr vs HF %.3g vs CPU %.3g | GPU bound (%g, greedy) kept: %v | greedy equal %v (%d/%d leading), follows CPU's within %g: %v (largest gap %.3g)",
					r.name, fullHF, fullCPU, incrHF, incrCPU, gpuGoldenTol, inGPU, eq, leadingEqual(got.greedy, base.greedy), len(base.greedy), greedyTieTol, follows, gap)
				if !eq {
					t.Logf("%-9s greedy %v", r.name, got.greedy)
				}
				if r.bound && (max(fullHF, incrHF) > goldenTol || !eq) {
					t.Errorf("%s: outside the CPU golden bound (%g of transformers' logits, greedy equal)", r.name, goldenTol)
				}
			}
		})
	}
	t.Run("defaultmodel", func(t *testing.T) { testDefaultModelRounding(t) })
}

// testDefaultModelRounding runs the same comparison on the built-in model's
// bf16 checkpoint (trained weights, internal/defaultmodel/testdata) against
// its PyTorch fixture.
func testDefaultModelRounding(t *testing.T) {
	td := filepath.Join("..", "internal", "defaultmodel", "testdata")
	dir := filepath.Join(td, "bf16")
	ck, err := weights.Open(filepath.Join(td, "fixture.safetensors"))
	if err != nil {
		t.Skip(err)
	}
	defer ck.Close()
	prompt, want := golden.Int32s(t, ck, "prompt_ids"), golden.Int32s(t, ck, "greedy_ids")
	var seqs [][]int32
	var refs [][]float32
	for k := 0; ck.Has(fmt.Sprintf("input_ids_%d", k)); k++ {
		seqs = append(seqs, golden.Int32s(t, ck, fmt.Sprintf("input_ids_%d", k)))
		v, _ := golden.Float32s(t, ck, fmt.Sprintf("logits_%d", k))
		refs = append(refs, v)
	}
	run := func(r *xRounding) (logits [][]float32, greedy []int32, m Model) {
		var be backend.Backend = cpu.NewWithOptions(cpu.Options{ReferenceNVFP4: true})
		if r != nil {
			be = &roundingBackend{Backend: be.(*cpu.Backend), r: *r, names: map[backend.Weight]string{}}
		}
		f, m, err := Open(dir, be, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		for _, ids := range seqs {
			st, _ := m.NewState(len(ids))
			out, err := m.Forward(context.Background(), st, ids, true)
			if err != nil {
				t.Fatal(err)
			}
			logits = append(logits, out)
		}
		return logits, greedyFrom(t, m, prompt, len(want)), m
	}
	diff := func(a, b [][]float32) float64 {
		var d float64
		for i := range a {
			d = max(d, maxAbsDiff(a[i], b[i]))
		}
		return d
	}
	bl, bg, _ := run(nil)
	t.Logf("%-9s %d sequences, full vs PyTorch %.3g, greedy %d/%d leading equal PyTorch's", "none", len(seqs), diff(bl, refs), leadingEqual(bg, want), len(want))
	for _, r := range xRoundings {
		l, g, m := run(&r)
		follows, gap := followsTokens(t, m, prompt, bg, greedyTieTol)
		t.Logf("%-9s full vs PyTorch %.3g vs CPU %.3g | greedy equal CPU's %v (%d/%d leading), follows CPU's within %g: %v (largest gap %.3g); %d/%d leading equal PyTorch's",
			r.name, diff(l, refs), diff(l, bl), slices.Equal(g, bg), leadingEqual(g, bg), len(bg), greedyTieTol, follows, gap, leadingEqual(g, want), len(want))
	}
}
