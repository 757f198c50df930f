package kernels

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// TestPagedBatchOnGPU: sequences of different lengths run as one batched
// step a token (ForwardBatch over a paged cache on the GPU: the paged
// kernels and the NVFP4 matmuls at m > 1), some joining mid-run and one
// sharing a prompt prefix with another, give each sequence the logits it
// gives alone (its own unpaged cache, one token a step: the m = 1 kernels)
// within 2e-2, and the same greedy tokens up to near-ties. The batched run
// is fed the tokens alone picked, so that a near-tie does not send a
// sequence elsewhere. Head sizes 64 (Llama) and 128 (Qwen3).
func TestPagedBatchOnGPU(t *testing.T) {
	g := newGPU(t)
	for _, tc := range []struct {
		hd    int
		qwen3 bool
	}{{64, false}, {128, true}} {
		t.Run(fmt.Sprintf("hd=%d/qwen3=%v", tc.hd, tc.qwen3), func(t *testing.T) {
			spec := testmodel.Llama{Layers: 2, Hidden: 512, FFN: 1024, Heads: 8, KVHeads: 2, HeadDim: tc.hd, Vocab: 512,
				DType: weights.BF16, NVFP4: true, Qwen3: tc.qwen3, Seed: 5}
			dir := testmodel.WriteTemp(t, spec)
			f, err := model.ReadFolder(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, err := model.Build(g, f, model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			testPagedBatch(t, m, spec.Vocab)
		})
	}
}

// TestPagedBatchOnCPU is TestPagedBatchOnGPU's check on the CPU backend,
// so that its harness runs without a GPU too.
func TestPagedBatchOnCPU(t *testing.T) {
	spec := testmodel.Llama{Layers: 2, Hidden: 512, FFN: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, Vocab: 512,
		DType: weights.BF16, NVFP4: true, Qwen3: true, Seed: 5}
	f, err := model.ReadFolder(testmodel.WriteTemp(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := model.Build(refCPU(), f, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testPagedBatch(t, m, spec.Vocab)
}

func testPagedBatch(t *testing.T, m model.Model, vocab int) {
	ctx := context.Background()
	const steps, capacity = 12, 512
	lengths := []int{1, 5, 37, 130, 300, 20, 9}
	join := []int{0, 0, 0, 0, 0, 2, 3} // the step at which each sequence starts
	prompts := make([][]int32, len(lengths))
	for i, n := range lengths {
		prompts[i] = make([]int32, n)
		for j := range prompts[i] {
			prompts[i][j] = int32(2 + (i*37+j*13)%(vocab-2))
		}
	}
	prompts[5] = append(append([]int32(nil), prompts[3][:100]...), prompts[5]...) // shares 100 tokens with 3

	// Alone: each sequence in its own cache.
	want := make([][][]float32, len(prompts)) // [seq][step][vocab]
	tokens := make([][]int32, len(prompts))
	for i, p := range prompts {
		st, err := m.NewState(capacity)
		if err != nil {
			t.Fatal(err)
		}
		in := p
		for range steps {
			logits, err := m.Forward(ctx, st, in, false)
			if err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], logits)
			tok := int32(layers.Argmax(logits))
			tokens[i] = append(tokens[i], tok)
			in = []int32{tok}
		}
	}

	pg, ok := m.(model.Pager)
	bf, ok2 := m.(model.BatchForwarder)
	if !ok || !ok2 {
		t.Fatalf("model %T pages no cache or runs no batch", m)
	}
	pc, err := pg.NewPagedCache(len(prompts)*((capacity+15)/16), 16)
	if err != nil {
		t.Fatal(err)
	}
	states := make([]model.State, len(prompts))
	worst := 0.0
	for step := 0; ; step++ {
		var sts []model.State
		var in [][]int32
		var who []int
		for i, p := range prompts {
			k := step - join[i] // this sequence's own step
			if k < 0 || k >= steps {
				continue
			}
			if k == 0 {
				if states[i], err = pc.NewState(capacity); err != nil {
					t.Fatal(err)
				}
				n := pc.Share(states[i], p)
				t.Logf("sequence %d joins at step %d: %d of its %d prompt tokens shared", i, step, n, len(p))
				in = append(in, p[n:])
			} else {
				in = append(in, tokens[i][k-1:k])
			}
			sts = append(sts, states[i])
			who = append(who, i)
		}
		if len(sts) == 0 {
			break
		}
		logits, err := bf.ForwardBatch(ctx, sts, in)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for j, i := range who {
			k := step - join[i]
			got, w := logits[j*vocab:(j+1)*vocab], want[i][k]
			d := 0.0
			for v := range got {
				d = max(d, math.Abs(float64(got[v]-w[v])))
				if math.IsNaN(float64(got[v])) {
					d = math.Inf(1)
				}
			}
			worst = max(worst, d)
			if d > 2e-2 {
				t.Errorf("sequence %d, its step %d (batch step %d of %d sequences): logits %g from alone's", i, k, step, len(sts), d)
			}
			if b := layers.Argmax(got); int32(b) != tokens[i][k] && w[tokens[i][k]]-w[b] > greedyTieTol {
				t.Errorf("sequence %d, its step %d: batched picks %d, alone %d (alone's gap %g)", i, k, b, tokens[i][k], w[tokens[i][k]]-w[b])
			}
		}
	}
	t.Logf("largest logit difference from alone: %.3g", worst)
}

// timeSteps runs step once (first-use work stays out of the timing), then
// b.N times, and returns the seconds of one.
func timeSteps(b *testing.B, g *Backend, step func()) float64 {
	b.Helper()
	step()
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start).Seconds() / float64(b.N)
}

// attention8B is the Llama-3-8B and Qwen3-8B attention shape the paged
// benchmarks time (32 query heads, 8 kv heads of 128) and its RoPE.
func attention8B(b *testing.B) (layers.AttentionShape, *layers.RoPE) {
	b.Helper()
	const heads, kvHeads, hd = 32, 8, 128
	rope, err := layers.NewRoPE(layers.RoPEParams{Theta: 5e5}, hd)
	if err != nil {
		b.Fatal(err)
	}
	return layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}, rope
}

// BenchmarkPagedAttention times one layer's PagedAppendRoPE and
// PagedAttention of c sequences decoding at once at the Llama-3-8B and
// Qwen3-8B attention shape (32 query heads, 8 kv heads of 128, blocks of
// 16 positions, tables shuffled over the pool) after ctx positions each.
// The append moves into the attention (paged_attn_*_rope) as the default
// path takes it; -unfused keeps them apart (paged_append, then paged_attn).
// unpaged: Backend.RoPE and Backend.Attention of one sequence in its own
// cache (attn_decode with the RoPE moved in at these lengths, the
// single-stream path) for comparison at c = 1.
//
// Each case prints a RESULT line: us_per_layer, the host's wall time a step
// (graphs off: at c = 1 the launch costs count); kernel_us, the device time
// of the kernels a step launches (pagedKernelTime: a profile of 32 more
// steps, launched one by one); floor_us, the keys and values read (float32
// cache) at the copy bandwidth measured in the same process; and
// pct_of_floor, floor_us / kernel_us. ctx = 548 is the measured 8B decode
// length (548 positions: the split shape's awkward case).
func BenchmarkPagedAttention(b *testing.B) {
	g := newGPU(b)
	g.SetGraphs(GraphsOff)
	bw := g.CopyBandwidth()
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	const heads, kvHeads, hd, bs = 32, 8, 128, 16
	s, rope := attention8B(b)
	rng := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) backend.Buffer { return upload(g, testnum.Normal(rng, n, 0, 1)) }
	report := func(b *testing.B, name string, ctxLen, c int, step func()) {
		sec := timeSteps(b, g, step)
		kern, names := pagedKernelTime(b, g, step)
		bytes := float64(c*(ctxLen+1)*kvHeads*hd) * 8 // keys and values, float32
		floor := bytes / bw
		b.ReportMetric(sec*1e6, "us/layer")
		b.ReportMetric(kern*1e6, "kernel-us")
		b.ReportMetric(100*floor/kern, "%floor")
		fmt.Printf("RESULT paged-attention %s ctx=%d c=%d us_per_layer=%.1f kernel_us=%.1f floor_us=%.1f pct_of_floor=%.0f kernels=%s\n",
			name, ctxLen, c, sec*1e6, kern*1e6, floor*1e6, 100*floor/kern, names)
	}
	for _, ctxLen := range []int{548, 2048} {
		for _, c := range []int{1, 8, 32, 128} {
			for _, unfused := range []bool{false, true} {
				per := (ctxLen + 1 + bs - 1) / bs
				variant := map[bool]string{false: "paged", true: "paged-unfused"}[unfused]
				b.Run(fmt.Sprintf("ctx=%d/c=%d/%s", ctxLen, c, variant), func(b *testing.B) {
					g.force.pagedUnfused = unfused
					defer func() { g.force.pagedUnfused = false }()
					pool, err := g.NewBlockPool(backend.PagedShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, Blocks: c * per})
					if err != nil {
						b.Fatal(err)
					}
					perm := rng.Perm(c * per)
					seqs := make([]layers.PagedSeq, c)
					for i := range seqs {
						t := make([]int32, per)
						for j := range t {
							t[j] = int32(perm[i*per+j])
						}
						seqs[i] = layers.PagedSeq{Table: t, Pos0: ctxLen, Rows: 1}
					}
					q, k, v, out := fill(c*heads*hd), fill(c*kvHeads*hd), fill(c*kvHeads*hd), g.NewBuffer(c*heads*hd)
					report(b, variant, ctxLen, c, func() {
						g.PagedAppendRoPE(pool, 0, q, k, v, seqs, heads, rope)
						g.PagedAttention(out, q, pool, 0, seqs, s)
					})
				})
			}
		}
		b.Run(fmt.Sprintf("ctx=%d/c=1/unpaged", ctxLen), func(b *testing.B) {
			cache, err := g.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: ctxLen + 1})
			if err != nil {
				b.Fatal(err)
			}
			q, k, v, out := fill(heads*hd), fill(kvHeads*hd), fill(kvHeads*hd), g.NewBuffer(heads*hd)
			kc, vc := fill(ctxLen*kvHeads*hd), fill(ctxLen*kvHeads*hd)
			g.Attention(g.NewBuffer(ctxLen*heads*hd), fill(ctxLen*heads*hd), kc, vc, cache, 0, 0, ctxLen, s)
			report(b, "unpaged", ctxLen, 1, func() {
				cache.Truncate(ctxLen)
				g.RoPE(q, 1, heads, hd, 0, ctxLen, rope, false)
				g.RoPE(k, 1, kvHeads, hd, 0, ctxLen, rope, false)
				g.Attention(out, q, k, v, cache, 0, ctxLen, 1, s)
			})
		})
	}
}

// pagedKernelTime profiles 32 runs of step (after timeSteps ran it) and
// returns the device seconds a run of the kernels it launched, summed, and
// their names. The profile launches kernel by kernel between CUDA events,
// without programmatic dependent launch; queued back to back, the events
// time the kernels rather than the host's launches wherever a kernel takes
// longer than its launch.
func pagedKernelTime(b *testing.B, g *Backend, step func()) (float64, string) {
	b.Helper()
	const runs = 32
	g.StartProfile()
	for range runs {
		step()
	}
	prof := g.StopProfile()
	if err := g.Sync(); err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	var names []string
	for _, k := range prof {
		total += k.Total
		names = append(names, k.Name)
	}
	slices.Sort(names)
	return total.Seconds() / runs, strings.Join(names, "+")
}

// TestPagedTablesPastStepValues: block tables too long for the queue's
// step values (pagedBigSlots) go to a device array of their own, copied
// once while the tables stay the same (two layers, then a step that
// changes them), and attention over them matches the reference.
func TestPagedTablesPastStepValues(t *testing.T) {
	g := newGPU(t)
	const bs, n = 1, 18000 // blocks of one position: a table entry a position
	s := layers.AttentionShape{Heads: 2, KVHeads: 1, HeadDim: 8, Scale: 0.35}
	w := s.KVHeads * s.HeadDim
	blocks := 2*n + 4
	pool, err := g.NewBlockPool(backend.PagedShape{Layers: 2, KVHeads: s.KVHeads, HeadDim: s.HeadDim, BlockSize: bs, Blocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rnd := func(n int) []float32 { return testnum.Normal(rng, n, 0, 1) }
	up := func(v []float32) backend.Buffer { return upload(g, v) }
	perm := rng.Perm(blocks)
	seqs := make([]layers.PagedSeq, 2)
	for i := range seqs {
		tab := make([]int32, n)
		for j := range tab {
			tab[j] = int32(perm[i*n+j])
		}
		seqs[i] = layers.PagedSeq{Table: tab, Pos0: n - 1 - 100*i, Rows: 1}
	}
	if pagedSlots(seqs) <= pagedBigSlots {
		t.Fatalf("tables of %d values fit the step values", pagedSlots(seqs))
	}
	kRef, vRef := make([][]float32, 2), make([][]float32, 2)
	for l := range 2 {
		kRef[l], vRef[l] = make([]float32, blocks*bs*w), make([]float32, blocks*bs*w)
		for _, sq := range seqs {
			k, v := rnd((sq.Pos0+1)*w), rnd((sq.Pos0+1)*w)
			layers.PagedWrite(kRef[l], k, sq.Table, bs, w, 0, sq.Pos0+1)
			layers.PagedWrite(vRef[l], v, sq.Table, bs, w, 0, sq.Pos0+1)
			g.PagedAppend(pool, l, up(k), up(v), sq.Table, 0, sq.Pos0+1)
		}
	}
	for step := range 2 {
		if step == 1 { // the tables change: sequence 1 one position on
			seqs[1].Pos0++
		}
		q := rnd(2 * s.Heads * s.HeadDim)
		qb := up(q)
		outs := []backend.Buffer{g.NewBuffer(len(q)), g.NewBuffer(len(q))}
		for l := range 2 {
			g.PagedAttention(outs[l], qb, pool, l, seqs, s)
		}
		for l := range 2 {
			want := make([]float32, len(q))
			layers.PagedAttention(want, q, kRef[l], vRef[l], seqs, bs, s)
			got := make([]float32, len(q))
			g.Read(got, outs[l], 0)
			if err := g.Sync(); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-4 || math.IsNaN(d) {
					t.Fatalf("step %d, layer %d: value %d is %g, want %g", step, l, i, got[i], want[i])
				}
			}
		}
	}
}

// BenchmarkPagedPrefill times one layer's RoPE, append and attention of a
// 512-row prompt chunk after pos0 positions at the 8B attention shape:
// paged (paged_prefill's tiles; -untiled: paged_attn a row a block) and
// unpaged (Backend.Attention: attn_prefill), in one run.
func BenchmarkPagedPrefill(b *testing.B) {
	g := newGPU(b)
	g.SetGraphs(GraphsOff)
	const heads, kvHeads, hd, bs, m = 32, 8, 128, 16, 512
	s, rope := attention8B(b)
	rng := rand.New(rand.NewPCG(1, 3))
	fill := func(n int) backend.Buffer { return upload(g, testnum.Normal(rng, n, 0, 1)) }
	q, k, v, out := fill(m*heads*hd), fill(m*kvHeads*hd), fill(m*kvHeads*hd), g.NewBuffer(m*heads*hd)
	timeIt := func(b *testing.B, name string, step func()) {
		sec := timeSteps(b, g, step)
		b.ReportMetric(sec*1e6, "us/layer")
		fmt.Printf("RESULT paged-prefill %s us_per_layer=%.1f\n", name, sec*1e6)
	}
	for _, pos0 := range []int{0, 1536} {
		per := (pos0 + m + bs - 1) / bs
		pool, err := g.NewBlockPool(backend.PagedShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, BlockSize: bs, Blocks: per})
		if err != nil {
			b.Fatal(err)
		}
		perm := rng.Perm(per)
		table := make([]int32, per)
		for j := range table {
			table[j] = int32(perm[j])
		}
		seqs := []layers.PagedSeq{{Table: table, Pos0: pos0, Rows: m}}
		for _, untiled := range []bool{false, true} {
			name := fmt.Sprintf("pos0=%d/paged%s", pos0, map[bool]string{false: "", true: "-untiled"}[untiled])
			b.Run(name, func(b *testing.B) {
				g.force.pagedNoTiles = untiled
				defer func() { g.force.pagedNoTiles = false }()
				timeIt(b, name, func() {
					g.PagedAppendRoPE(pool, 0, q, k, v, seqs, heads, rope)
					g.PagedAttention(out, q, pool, 0, seqs, s)
				})
			})
		}
		name := fmt.Sprintf("pos0=%d/unpaged", pos0)
		b.Run(name, func(b *testing.B) {
			cache, err := g.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: pos0 + m})
			if err != nil {
				b.Fatal(err)
			}
			if pos0 > 0 {
				g.Attention(g.NewBuffer(pos0*heads*hd), fill(pos0*heads*hd), fill(pos0*kvHeads*hd), fill(pos0*kvHeads*hd), cache, 0, 0, pos0, s)
			}
			timeIt(b, name, func() {
				cache.Truncate(pos0)
				g.RoPE(q, m, heads, hd, 0, pos0, rope, false)
				g.RoPE(k, m, kvHeads, hd, 0, pos0, rope, false)
				g.Attention(out, q, k, v, cache, 0, pos0, m, s)
			})
		})
	}
}
