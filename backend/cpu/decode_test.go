package cpu

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/quant"
)

// Issue 61's model (llama-1b-32k): hidden 2048, FFN 8192, GQA 32/8 heads of
// 64, NVFP4 linears, a bf16 LM head of vocabulary 32000, 16 layers.
const (
	l61Hidden, l61FFN, l61Heads, l61KVHeads, l61HeadDim, l61Vocab, l61Layers = 2048, 8192, 32, 8, 64, 32000, 16
)

// decodeWeights are the weights of issue 61's model, zero (the decode step
// is for counting and timing, not for its values): layer l's linears at
// linears[l], in the order q, k, v, o, gate, up, down.
type decodeWeights struct {
	linears [][7]backend.Weight
	lmHead  backend.Weight
}

// l61Weights uploads them once per test binary (a weight of one Backend
// works in another: the benchmarks' backends differ in threads only).
var l61Weights = sync.OnceValues(func() (*decodeWeights, error) {
	b := New(0)
	nvfp4 := func(rows, cols int) (backend.Weight, error) {
		q := &quant.NVFP4{Rows: rows, Cols: cols, Packed: make([]byte, rows*cols/2), Scales: make([]byte, rows*cols/16), GlobalScale: 1}
		return b.Upload(&backend.HostWeight{Name: "w", Rows: rows, Cols: cols, Format: backend.NVFP4, Q: q})
	}
	shapes := [7][2]int{
		{l61Heads * l61HeadDim, l61Hidden}, {l61KVHeads * l61HeadDim, l61Hidden}, {l61KVHeads * l61HeadDim, l61Hidden},
		{l61Hidden, l61Heads * l61HeadDim}, {l61FFN, l61Hidden}, {l61FFN, l61Hidden}, {l61Hidden, l61FFN},
	}
	w := &decodeWeights{linears: make([][7]backend.Weight, l61Layers)}
	for l := range w.linears {
		for i, s := range shapes {
			var err error
			if w.linears[l][i], err = nvfp4(s[0], s[1]); err != nil {
				return nil, err
			}
		}
	}
	var err error
	w.lmHead, err = b.Upload(&backend.HostWeight{Name: "lm_head", Rows: l61Vocab, Cols: l61Hidden, Format: backend.BF16, Data: make([]byte, 2*l61Vocab*l61Hidden)})
	return w, err
})

// decodeOp is one backend operation of a decode step, by name.
type decodeOp struct {
	name  string
	layer int // -1: the head's
	run   func()
}

// decodeStep is a decode step of issue 61's model on b at context pos+1,
// its first layers layers and the LM head, as model.Llama runs them
// (blocks, attend, head.logits).
func decodeStep(tb testing.TB, b *Backend, layerCount, pos int) []decodeOp {
	w, err := l61Weights()
	if err != nil {
		tb.Fatal(err)
	}
	const hidden, ffn, heads, kvHeads, hd = l61Hidden, l61FFN, l61Heads, l61KVHeads, l61HeadDim
	cache, err := b.NewKVCache(backend.KVShape{Layers: layerCount, KVHeads: kvHeads, HeadDim: hd, Capacity: pos + 1})
	if err != nil {
		tb.Fatal(err)
	}
	kc := cache.(*kvCache)
	buf := func(n int) Buffer {
		x := make(Buffer, n)
		for i := range x {
			x[i] = 1
		}
		return x
	}
	x, h, norm := buf(hidden), buf(hidden), buf(hidden)
	q, k, v, att := buf(heads*hd), buf(kvHeads*hd), buf(kvHeads*hd), buf(heads*hd)
	g, u, logits := buf(ffn), buf(ffn), buf(l61Vocab)
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 500000}, hd)
	if err != nil {
		tb.Fatal(err)
	}
	shape := layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: 0.125}
	var ops []decodeOp
	for l := range layerCount {
		lw := w.linears[l]
		ops = append(ops, []decodeOp{
			{"RMSNorm attn", l, func() { b.RMSNorm(h, x, norm, 1e-5) }},
			{"MatMul q 2048x2048", l, func() { b.MatMul(q, h, lw[0], 1) }},
			{"MatMul k 512x2048", l, func() { b.MatMul(k, h, lw[1], 1) }},
			{"MatMul v 512x2048", l, func() { b.MatMul(v, h, lw[2], 1) }},
			{"RoPE q", l, func() { b.RoPE(q, 1, heads, hd, 0, pos, rope, false) }},
			{"RoPE k", l, func() { b.RoPE(k, 1, kvHeads, hd, 0, pos, rope, false) }},
			{fmt.Sprintf("Attention ctx %d", pos+1), l, func() {
				kc.n[l] = pos // the step appends at pos each time it runs
				b.Attention(att, q, k, v, cache, l, pos, 1, shape)
			}},
			{"MatMul o 2048x2048", l, func() { b.MatMul(h, att, lw[3], 1) }},
			{"Add", l, func() { b.Add(x, x, h) }},
			{"RMSNorm mlp", l, func() { b.RMSNorm(h, x, norm, 1e-5) }},
			{"MatMul gate 8192x2048", l, func() { b.MatMul(g, h, lw[4], 1) }},
			{"MatMul up 8192x2048", l, func() { b.MatMul(u, h, lw[5], 1) }},
			{"SwiGLU", l, func() { b.SwiGLU(g, g, u, 0) }},
			{"MatMul down 2048x8192", l, func() { b.MatMul(h, g, lw[6], 1) }},
			{"Add", l, func() { b.Add(x, x, h) }},
		}...)
	}
	return append(ops,
		decodeOp{"head: RMSNorm", -1, func() { b.RMSNorm(h, x, norm, 1e-5) }},
		decodeOp{"head: MatMul bf16 32000x2048", -1, func() { b.MatMul(logits, h, w.lmHead, 1) }})
}

// TestDecodeFanOuts reports, for each op of a decode step of issue 61's
// model at 16 threads (and 2), its fan-outs: the units of work each offers
// and the goroutines it uses (-v prints the table; the counting needs no
// 16 cores), the fan-outs of a whole step (16 layers and the head) and the
// allocations of a layer and the head. It fails where an op that fans out
// offers fewer units than threads: those threads would idle.
func TestDecodeFanOuts(t *testing.T) {
	if testing.Short() {
		t.Skip("uploads 1 GB of weights")
	}
	for _, threads := range []int{2, 16} {
		b := New(threads)
		step := decodeStep(t, b, 1, 511)
		var report strings.Builder
		fmt.Fprintf(&report, "threads %d, context 512: op, then each fan-out's [pre runs+]units/goroutines (1/1: serial)\n", threads)
		fanOuts := 0
		for _, op := range step {
			var got []string
			b.trace = func(f fanOutTrace) {
				units, workers := f.units, f.workers
				if f.pre > 0 {
					got = append(got, fmt.Sprintf("%d+%d/%d", f.pre, units, workers))
				} else {
					got = append(got, fmt.Sprintf("%d/%d", units, workers))
				}
				if workers == 1 {
					return
				}
				if op.layer < 0 {
					fanOuts++
				} else {
					fanOuts += l61Layers
				}
				if units < threads {
					t.Errorf("threads %d: %s offers %d units", threads, op.name, units)
				}
			}
			op.run()
			b.trace = nil
			fmt.Fprintf(&report, "  %-30s %s\n", op.name, strings.Join(got, " "))
		}
		run := func() {
			for _, op := range step {
				op.run()
			}
		}
		allocs := testing.AllocsPerRun(5, run)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		run()
		runtime.ReadMemStats(&m1)
		fmt.Fprintf(&report, "  fan-outs a step (%d layers and the head): %d; a layer and the head allocate %.0f times, %d bytes",
			l61Layers, fanOuts, allocs, m1.TotalAlloc-m0.TotalAlloc)
		t.Log(report.String())
		b.Close()
	}
}

// BenchmarkDecodeStep times a whole decode step of issue 61's model at
// context 512 (16 layers of zero NVFP4 weights, 1 GB repacked, and the
// bf16 head) on GOMAXPROCS threads (-cpu 1,2,4,8,16 sweeps them): on the
// pool, and on goroutines started for each fan-out (the pool held, the
// path of concurrent callers: a matmul's quantization is then a fan-out of
// its own). The difference is what the pool saves; ms/step the step's
// time, which the zero weights stream like any others.
func BenchmarkDecodeStep(b *testing.B) {
	for _, onPool := range []bool{true, false} {
		name := "pool"
		if !onPool {
			name = "goroutines"
		}
		b.Run(name, func(b *testing.B) {
			be := New(0)
			defer be.Close()
			step := decodeStep(b, be, l61Layers, 511)
			if !onPool {
				be.pool.mu.Lock() // acquire fails: the goroutines path
				defer be.pool.mu.Unlock()
			}
			for b.Loop() {
				for _, op := range step {
					op.run()
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
		})
	}
}
