package gomlxbench

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/gomlx/gomlx/backends"
	_ "github.com/gomlx/gomlx/backends/simplego" // registers the pure-Go backend as "go"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/dtypes/bfloat16"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/tensors"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/modeltest"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// The Llama shape of engine.BenchmarkDecode.
const (
	hidden  = 1024
	ffn     = 2816
	heads   = 16
	kvHeads = 4
	headDim = hidden / heads
	group   = heads / kvHeads
	kvDim   = kvHeads * headDim
	vocab   = 32000
	nLayers = 12
	cached  = 32 // positions already in the KV cache; the decoded token is at position cached
	eps     = 1e-5
	theta   = 500000
)

// gomlxBackend makes GoMLX's pure-Go backend, selected by its registered
// name ("go", as in GOMLX_BACKEND=go); config is its option list ("" for the
// defaults, or e.g. "dotgeneral_large").
func gomlxBackend(tb testing.TB, config string) backends.Backend {
	tb.Helper()
	name := "go"
	if config != "" {
		name += ":" + config
	}
	be, err := backends.NewWithConfig(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(be.Finalize)
	return be
}

// format is the storage of the linear weights under test.
type format struct {
	name  string
	ours  backend.Format
	gomlx dtypes.DType
}

var formats = []format{
	{"f32", backend.F32, dtypes.Float32},
	{"bf16", backend.BF16, dtypes.BFloat16},
}

// linear is a weight matrix [rows, cols], row-major, as float32.
type linear struct {
	rows, cols int
	w          []float32
}

func newLinear(rng *rand.Rand, rows, cols int) linear {
	w := make([]float32, rows*cols)
	s := float32(math.Sqrt(3 / float64(cols))) // uniform with variance 1/cols
	for i := range w {
		w[i] = (2*rng.Float32() - 1) * s
	}
	return linear{rows, cols, w}
}

// ours uploads the weight to the CPU backend in format f (bf16 rounds to nearest even).
func (l linear) ours(tb testing.TB, be *cpu.Backend, f backend.Format) backend.Weight {
	tb.Helper()
	h := &backend.HostWeight{Name: "w", Rows: l.rows, Cols: l.cols, Format: f}
	switch f {
	case backend.F32:
		h.Data = unsafe.Slice((*byte)(unsafe.Pointer(&l.w[0])), 4*len(l.w))
	case backend.BF16:
		b := make([]uint16, len(l.w))
		for i, v := range l.w {
			b[i] = quant.Float32ToBF16(v)
		}
		h.Data = unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 2*len(b))
	}
	w, err := be.Upload(h)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

// gomlx makes a backend-resident GoMLX tensor of the weight in dtype dt, with
// the same bf16 rounding as ours.
func (l linear) gomlx(tb testing.TB, be backends.Backend, dt dtypes.DType) *tensors.Tensor {
	tb.Helper()
	var t *tensors.Tensor
	switch dt {
	case dtypes.Float32:
		t = tensors.FromFlatDataAndDimensions(l.w, l.rows, l.cols)
	case dtypes.BFloat16:
		b := make([]bfloat16.BFloat16, len(l.w))
		for i, v := range l.w {
			b[i] = bfloat16.FromBits(quant.Float32ToBF16(v))
		}
		t = tensors.FromFlatDataAndDimensions(b, l.rows, l.cols)
	}
	return onDevice(tb, be, t)
}

func onDevice(tb testing.TB, be backends.Backend, t *tensors.Tensor) *tensors.Tensor {
	tb.Helper()
	if err := t.MaterializeOnDevice(be, true, 0); err != nil {
		tb.Fatal(err)
	}
	return t
}

// gLinear is x [1, cols] · wᵀ in w's dtype (x converted to it, the product
// back to float32; the pure-Go backend accumulates bf16 products in float32).
func gLinear(x, w *graph.Node) *graph.Node {
	if w.DType() != x.DType() {
		x = graph.ConvertDType(x, w.DType())
	}
	y := graph.DotGeneral(x, []int{1}, nil, w, []int{1}, nil)
	if y.DType() != dtypes.Float32 {
		y = graph.ConvertDType(y, dtypes.Float32)
	}
	return y
}

// run executes e once and frees its outputs, returning the first as float32s
// when keep is set.
func run(tb testing.TB, e *graph.Exec, keep bool, args ...any) []float32 {
	out, err := e.Exec(args...)
	if err != nil {
		tb.Fatal(err)
	}
	var r []float32
	if keep {
		r = tensors.MustCopyFlatData[float32](out[0])
	}
	for _, t := range out {
		t.MustFinalizeAll()
	}
	return r
}

func randVec(rng *rand.Rand, n int, around, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = around + scale*(2*rng.Float32()-1)
	}
	return v
}

func maxRelDiff(a, b []float32) float64 {
	d, m := 0.0, 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return d / m
}

// BenchmarkMatVec times the decode-step matvec x[1, 4096] · W[4096, 4096]ᵀ on
// both backends and reports the weight bytes streamed per second. GoMLX's
// graph is compiled once and its weight is a backend-resident tensor.
func BenchmarkMatVec(b *testing.B) {
	const N, K = 4096, 4096
	rng := rand.New(rand.NewPCG(1, 1))
	w := newLinear(rng, N, K)
	x := randVec(rng, K, 0, 1)
	for _, f := range formats {
		bytes := float64(N*K) * f.ours.BytesPerValue()
		report := func(b *testing.B) {
			b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "weight-GB/s")
		}
		var want []float32
		b.Run(f.name+"/ours", func(b *testing.B) {
			be := cpu.New(0)
			wt := w.ours(b, be, f.ours)
			out := be.NewBuffer(N)
			for b.Loop() {
				be.MatMul(out, cpu.Buffer(x), wt, 1)
			}
			report(b)
			want = append([]float32(nil), cpu.Data(out)...)
		})
		for _, cfg := range []string{"", "dotgeneral_large"} {
			name := f.name + "/gomlx"
			if cfg != "" {
				name += "-" + cfg
			}
			b.Run(name, func(b *testing.B) {
				be := gomlxBackend(b, cfg)
				wt := w.gomlx(b, be, f.gomlx)
				xt := onDevice(b, be, tensors.FromFlatDataAndDimensions(x, 1, K))
				e, err := graph.NewExec(be, gLinear)
				if err != nil {
					b.Fatal(err)
				}
				defer e.Finalize()
				got := run(b, e, true, xt, wt) // compiles
				if want != nil {
					if d := maxRelDiff(got, want); d > 1e-2 {
						b.Fatalf("gomlx and ours disagree: max diff %.3g of max |y|", d)
					}
				}
				b.ResetTimer()
				for b.Loop() {
					run(b, e, false, xt, wt)
				}
				report(b)
			})
		}
	}
}

// layerW is one decoder layer: weights and the KV cache of the positions
// before the decoded token (keys already rotated).
type layerW struct {
	attnNorm, mlpNorm          []float32
	q, k, v, o, gate, up, down linear
	kc, vc                     []float32 // [cached, kvHeads, headDim]
}

func newLayer(rng *rand.Rand) *layerW {
	return &layerW{
		attnNorm: randVec(rng, hidden, 1, 0.1), mlpNorm: randVec(rng, hidden, 1, 0.1),
		q: newLinear(rng, hidden, hidden), k: newLinear(rng, kvDim, hidden), v: newLinear(rng, kvDim, hidden),
		o: newLinear(rng, hidden, hidden), gate: newLinear(rng, ffn, hidden), up: newLinear(rng, ffn, hidden),
		down: newLinear(rng, hidden, ffn),
		kc:   randVec(rng, cached*kvDim, 0, 1), vc: randVec(rng, cached*kvDim, 0, 1),
	}
}

func (l *layerW) linears() []linear { return []linear{l.q, l.k, l.v, l.o, l.gate, l.up, l.down} }

func (l *layerW) weightBytes(f backend.Format) float64 {
	n := 0
	for _, w := range l.linears() {
		n += w.rows * w.cols
	}
	return float64(n) * f.BytesPerValue()
}

// oursLayer is the layer on the CPU backend, run exactly as model/llama.go
// runs a Llama block for one token at position cached.
type oursLayer struct {
	be                                 *cpu.Backend
	attnNorm, mlpNorm                  backend.Buffer
	q, k, v, o, gate, up, down         backend.Weight
	cache                              backend.KVCache
	hb, qb, kb, vb, att, gateB, upB, x backend.Buffer
	rope                               *layers.RoPE
	shape                              layers.AttentionShape
}

func newOursLayer(tb testing.TB, be *cpu.Backend, l *layerW, f backend.Format) *oursLayer {
	tb.Helper()
	rope, err := layers.NewRoPE(layers.RoPEParams{Type: "default", Theta: theta}, headDim)
	if err != nil {
		tb.Fatal(err)
	}
	cache, err := be.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: headDim, Capacity: cached + 1})
	if err != nil {
		tb.Fatal(err)
	}
	o := &oursLayer{
		be: be, attnNorm: cpu.Buffer(l.attnNorm), mlpNorm: cpu.Buffer(l.mlpNorm),
		q: l.q.ours(tb, be, f), k: l.k.ours(tb, be, f), v: l.v.ours(tb, be, f), o: l.o.ours(tb, be, f),
		gate: l.gate.ours(tb, be, f), up: l.up.ours(tb, be, f), down: l.down.ours(tb, be, f),
		cache: cache, hb: be.NewBuffer(hidden), qb: be.NewBuffer(hidden), kb: be.NewBuffer(kvDim),
		vb: be.NewBuffer(kvDim), att: be.NewBuffer(hidden), gateB: be.NewBuffer(ffn), upB: be.NewBuffer(ffn),
		x: be.NewBuffer(hidden), rope: rope,
		shape: layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: headDim, Scale: float32(1 / math.Sqrt(headDim))},
	}
	// Fill positions [0, cached) with the given keys and values.
	qs := be.NewBuffer(cached * hidden)
	be.Attention(be.NewBuffer(cached*hidden), qs, cpu.Buffer(l.kc), cpu.Buffer(l.vc), cache, 0, 0, cached, o.shape)
	return o
}

// step runs the layer on x in place for the token at position cached.
func (o *oursLayer) step(x backend.Buffer) {
	b := o.be
	b.RMSNorm(o.hb, x, o.attnNorm, eps)
	b.MatMul(o.qb, o.hb, o.q, 1)
	b.MatMul(o.kb, o.hb, o.k, 1)
	b.MatMul(o.vb, o.hb, o.v, 1)
	b.RoPE(o.qb, 1, heads, headDim, 0, cached, o.rope, false)
	b.RoPE(o.kb, 1, kvHeads, headDim, 0, cached, o.rope, false)
	b.Attention(o.att, o.qb, o.kb, o.vb, o.cache, 0, cached, 1, o.shape)
	b.MatMul(o.hb, o.att, o.o, 1)
	b.Add(x, x, o.hb)
	b.RMSNorm(o.hb, x, o.mlpNorm, eps)
	b.MatMul(o.gateB, o.hb, o.gate, 1)
	b.MatMul(o.upB, o.hb, o.up, 1)
	b.SwiGLU(o.gateB, o.gateB, o.upB, 0)
	b.MatMul(o.hb, o.gateB, o.down, 1)
	b.Add(x, x, o.hb)
}

// gomlx parameters per layer, in graph order.
const paramsPerLayer = 11

func (l *layerW) gomlxParams(tb testing.TB, be backends.Backend, dt dtypes.DType) []any {
	vec := func(v []float32, dims ...int) *tensors.Tensor {
		return onDevice(tb, be, tensors.FromFlatDataAndDimensions(v, dims...))
	}
	return []any{
		vec(l.attnNorm, hidden), l.q.gomlx(tb, be, dt), l.k.gomlx(tb, be, dt), l.v.gomlx(tb, be, dt),
		l.o.gomlx(tb, be, dt), vec(l.mlpNorm, hidden), l.gate.gomlx(tb, be, dt), l.up.gomlx(tb, be, dt),
		l.down.gomlx(tb, be, dt), vec(l.kc, cached, kvHeads, headDim), vec(l.vc, cached, kvHeads, headDim),
	}
}

func gRMSNorm(x, w *graph.Node) *graph.Node {
	inv := graph.Rsqrt(graph.AddScalar(graph.ReduceAndKeep(graph.Square(x), graph.ReduceMean, -1), eps))
	return graph.Mul(graph.Mul(x, inv), graph.InsertAxes(w, 0))
}

// gRoPE rotates the pairs (i, i+headDim/2) of x [n, headDim] by cos, sin [1, headDim/2].
func gRoPE(x, cos, sin *graph.Node) *graph.Node {
	x1 := graph.SliceAxis(x, 1, graph.AxisRange(0, headDim/2))
	x2 := graph.SliceAxis(x, 1, graph.AxisRange(headDim/2, headDim))
	return graph.Concatenate([]*graph.Node{graph.Sub(graph.Mul(x1, cos), graph.Mul(x2, sin)), graph.Add(graph.Mul(x2, cos), graph.Mul(x1, sin))}, 1)
}

// gLayer is one decoder layer's decode step: x [1, hidden] at position
// cached, attending over the p = cached given positions plus its own.
func gLayer(x, cos, sin *graph.Node, p []*graph.Node) *graph.Node {
	attnNorm, wq, wk, wv, wo, mlpNorm, wg, wu, wd, kc, vc := p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10]
	h := gRMSNorm(x, attnNorm)
	q := gRoPE(graph.Reshape(gLinear(h, wq), heads, headDim), cos, sin)
	k := gRoPE(graph.Reshape(gLinear(h, wk), kvHeads, headDim), cos, sin)
	v := gLinear(h, wv)
	keys := graph.Concatenate([]*graph.Node{kc, graph.Reshape(k, 1, kvHeads, headDim)}, 0)   // [cached+1, kvHeads, headDim]
	values := graph.Concatenate([]*graph.Node{vc, graph.Reshape(v, 1, kvHeads, headDim)}, 0) // [cached+1, kvHeads, headDim]
	q3 := graph.Reshape(q, kvHeads, group, headDim)
	scores := graph.DotGeneral(q3, []int{2}, []int{0}, keys, []int{2}, []int{1}) // [kvHeads, group, cached+1]
	probs := graph.Softmax(graph.MulScalar(scores, 1/math.Sqrt(headDim)), -1)
	att := graph.DotGeneral(probs, []int{2}, []int{0}, values, []int{0}, []int{1}) // [kvHeads, group, headDim]
	x = graph.Add(x, gLinear(graph.Reshape(att, 1, hidden), wo))
	h = gRMSNorm(x, mlpNorm)
	g := gLinear(h, wg)
	m := graph.Mul(graph.Mul(g, graph.Sigmoid(g)), gLinear(h, wu))
	return graph.Add(x, gLinear(m, wd))
}

// gModel is the graph of inputs x, cos, sin, then paramsPerLayer per layer,
// then (when head is set) the final norm and the LM head.
func gModel(head bool) func([]*graph.Node) *graph.Node {
	return func(in []*graph.Node) *graph.Node {
		x, cos, sin := in[0], in[1], in[2]
		p := in[3:]
		for len(p) >= paramsPerLayer {
			x = gLayer(x, cos, sin, p[:paramsPerLayer])
			p = p[paramsPerLayer:]
		}
		if head {
			x = gLinear(gRMSNorm(x, p[0]), p[1])
		}
		return x
	}
}

// ropeAngles are cos and sin at position cached, as the CPU backend computes them.
func ropeAngles(tb testing.TB) (cos, sin []float32) {
	rope, err := layers.NewRoPE(layers.RoPEParams{Type: "default", Theta: theta}, headDim)
	if err != nil {
		tb.Fatal(err)
	}
	cos, sin = make([]float32, headDim/2), make([]float32, headDim/2)
	layers.RoPEAngles(cos, sin, cached, rope, false)
	return cos, sin
}

func gomlxInputs(tb testing.TB, be backends.Backend, x []float32) []any {
	cos, sin := ropeAngles(tb)
	return []any{
		onDevice(tb, be, tensors.FromFlatDataAndDimensions(x, 1, hidden)),
		onDevice(tb, be, tensors.FromFlatDataAndDimensions(cos, 1, headDim/2)),
		onDevice(tb, be, tensors.FromFlatDataAndDimensions(sin, 1, headDim/2)),
	}
}

// TestLayerAgrees checks that the two implementations of the layer compute
// the same thing, so the benchmark compares like with like.
func TestLayerAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	l := newLayer(rng)
	x := randVec(rng, hidden, 0, 1)
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			o := newOursLayer(t, cpu.New(0), l, f.ours)
			want := append(cpu.Buffer(nil), x...)
			o.step(want)
			be := gomlxBackend(t, "")
			e, err := graph.NewExec(be, gModel(false))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Finalize()
			got := run(t, e, true, append(gomlxInputs(t, be, x), l.gomlxParams(t, be, f.gomlx)...)...)
			// gomlx rounds the activations to bf16 before each bf16 matmul; ours keeps them f32.
			tol := map[string]float64{"f32": 1e-5, "bf16": 2e-2}[f.name]
			d := maxRelDiff(got, want)
			t.Logf("max diff %.3g of max |y|", d)
			if d > tol {
				t.Errorf("max diff %.3g of max |y|, want <= %g", d, tol)
			}
		})
	}
}

// BenchmarkLayer times one Llama decoder layer's decode step (RMSNorm, q/k/v
// matvecs, RoPE, GQA attention over 32 cached positions plus the new one, o
// matvec, residual, RMSNorm, SwiGLU MLP, residual) at hidden 1024, FFN 2816,
// 16 heads, 4 KV heads. GoMLX receives the cache as a parameter (it is not
// appended to); ours writes the new position into its KV cache.
func BenchmarkLayer(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	l := newLayer(rng)
	x := randVec(rng, hidden, 0, 1)
	for _, f := range formats {
		bytes := l.weightBytes(f.ours)
		report := func(b *testing.B) {
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(bytes/sec/1e9, "weight-GB/s")
		}
		b.Run(f.name+"/ours", func(b *testing.B) {
			o := newOursLayer(b, cpu.New(0), l, f.ours)
			xb := append(cpu.Buffer(nil), x...)
			for b.Loop() {
				copy(xb, x)
				o.step(xb)
			}
			report(b)
		})
		b.Run(f.name+"/gomlx", func(b *testing.B) {
			be := gomlxBackend(b, "")
			e, err := graph.NewExec(be, gModel(false))
			if err != nil {
				b.Fatal(err)
			}
			defer e.Finalize()
			args := append(gomlxInputs(b, be, x), l.gomlxParams(b, be, f.gomlx)...)
			run(b, e, false, args...) // compiles
			b.ResetTimer()
			for b.Loop() {
				run(b, e, false, args...)
			}
			report(b)
		})
	}
}

// BenchmarkToken times one whole decode token of the 12-layer model of
// engine.BenchmarkDecode (vocab 32000): ours is the engine itself (embedding,
// 12 layers with a growing KV cache after a 32-token prompt, final norm, LM
// head), GoMLX is the same layers, final norm and LM head on an embedded
// input row with 32 cached positions per layer given as parameters.
func BenchmarkToken(b *testing.B) {
	for _, f := range formats {
		lmBytes := float64(vocab*hidden) * f.ours.BytesPerValue()
		b.Run(f.name+"/ours", func(b *testing.B) {
			dt := map[backend.Format]weights.DType{backend.F32: weights.F32, backend.BF16: weights.BF16}[f.ours]
			spec := testmodel.Llama{Layers: nLayers, Hidden: hidden, FFN: ffn, Heads: heads, KVHeads: kvHeads, Vocab: vocab, DType: dt, Seed: 1}
			_, s := modeltest.Open(b, testmodel.WriteTemp(b, spec), engine.Options{ContextLength: 2048})
			prompt := make([]int, cached)
			for i := range prompt {
				prompt[i] = i + 2
			}
			ctx := context.Background()
			if _, err := s.Append(ctx, prompt); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for b.Loop() {
				if s.Len() == s.ContextLength() {
					s.Truncate(cached)
				}
				if _, err := s.Append(ctx, []int{7}); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(float64(spec.WeightBytes())/sec/1e9, "weight-GB/s")
		})
		b.Run(f.name+"/gomlx", func(b *testing.B) {
			rng := rand.New(rand.NewPCG(4, 4))
			be := gomlxBackend(b, "")
			args := gomlxInputs(b, be, randVec(rng, hidden, 0, 1))
			bytes := lmBytes
			for range nLayers {
				l := newLayer(rng)
				bytes += l.weightBytes(f.ours)
				args = append(args, l.gomlxParams(b, be, f.gomlx)...)
			}
			args = append(args,
				onDevice(b, be, tensors.FromFlatDataAndDimensions(randVec(rng, hidden, 1, 0.1), hidden)),
				newLinear(rng, vocab, hidden).gomlx(b, be, f.gomlx))
			e, err := graph.NewExec(be, gModel(true))
			if err != nil {
				b.Fatal(err)
			}
			defer e.Finalize()
			if got := run(b, e, true, args...); len(got) != vocab {
				b.Fatalf("gomlx returned %d logits, want %d", len(got), vocab)
			}
			b.ResetTimer()
			for b.Loop() {
				run(b, e, false, args...)
			}
			sec := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(1/sec, "tok/s")
			b.ReportMetric(bytes/sec/1e9, "weight-GB/s")
		})
	}
}
