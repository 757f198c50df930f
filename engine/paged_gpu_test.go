package engine

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

// TestPoolPagedBatchedGPU: on the GPU, a pool's sessions (a paged cache:
// the paged kernels) generating at once, joining at different times with
// prompts of different lengths (one chunked, two sharing a prefix), half
// greedy and half drawing with top-k and a seed each (the batched steps'
// tokens picked on the device, backend.BatchTokenSampler), give the tokens
// each gives alone (its own cache, the unbatched model: the m = 1 kernels
// and the single-row sampler). Skipped without a GPU; the CPU runs the
// same pool in TestPoolPagedSharing and TestBatchedGenerateMatchesAlone.
func TestPoolPagedBatchedGPU(t *testing.T) {
	skipWithoutGPU(t)
	for _, qwen3 := range []bool{false, true} {
		t.Run(fmt.Sprintf("qwen3=%v", qwen3), func(t *testing.T) {
			batched, alone := batchModelOn(t, qwen3, "cuda")
			vocab := batched.Config().VocabSize
			prompts := mixedPrompts(vocab, 17) // 4 shares a block of 16 with 3
			opts := func(i int) GenerateOptions {
				o := GenerateOptions{MaxTokens: 24, StopTokens: []int{}}
				if i%2 == 1 {
					o.Sampling = SamplingOptions{Temperature: 0.9, TopK: 1 + 7*i, Seed: uint64(100 + i)}
				}
				return o
			}
			want := aloneTokens(t, alone, prompts, opts)
			pool, err := batched.NewPool(PoolOptions{Sessions: len(prompts), ContextLength: 512, BlockSize: 16})
			if err != nil {
				t.Fatal(err)
			}
			if st := pool.Stats(); !st.Paged {
				t.Fatalf("the pool's cache is not paged on the GPU: %+v", st)
			}
			got := concurrentTokens(t, prompts, func(i int, p []int) ([]int, error) {
				s, n, err := pool.Acquire(context.Background(), p)
				if err != nil {
					return nil, err
				}
				defer pool.Release(s)
				res, err := s.Generate(context.Background(), p[n:], opts(i), nil)
				if err != nil {
					return nil, err
				}
				return res.Tokens, nil
			})
			for i := range prompts {
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("session %d (%d prompt tokens, %+v): batched %v, alone %v", i, len(prompts[i]), opts(i).Sampling, got[i], want[i])
				}
			}
			st := batched.BatchStats()
			if st.Steps == 0 || st.Sequences <= st.Steps {
				t.Errorf("no step was batched: %+v", st)
			}
			t.Logf("%+v: mean batch %.1f", st, float64(st.Sequences)/float64(st.Steps))
		})
	}
}

// BenchmarkPoolLlama8B is issue 60's serving benchmark in process: c
// requests at once through a Pool (c sessions), each a distinct 512-token
// prompt and 256 greedy output tokens, at the Llama-3-8B shape (NVFP4
// linears, random weights), with the paged cache (the default: paged
// kernels, batched steps, batched picks on the device) and with a cache a
// session (PoolOptions.Unpaged), alternating, in one run, after a warm-up
// request of each kind (the first sub-benchmark ran cold before); it
// reports the output tokens/s of each (prefill included) and their ratio,
// at c = 1 also a plain Session's (no pool), and of the paged run its
// steps, mean batch, gathers that waited out BatchOptions.Gather and
// where the wall time went (RESULT poolsteps: prefill and decode steps,
// host phases a step; scheduler.stepTimes). Its steps sub-benchmark runs
// batched decode steps directly (no scheduler) at batch sizes 8..128 over
// sequences of 512 prompt tokens and prints each one's wall time, host
// time and per-kernel device time (PROFILE lines), and the single-stream
// decode step and 512-token prefill paged and unpaged, per kernel.
// MANIFOLD_BENCH_DIR may name BenchmarkDecodeLlama8B's checkpoint folder;
// the benchmark's own knobs (test binaries only): MANIFOLD_POOL_C, the
// concurrencies (comma-separated; default 1,8,32,128,256);
// MANIFOLD_POOL_MAXSEQ, BatchOptions.MaxSequences values to run each c
// with (sub-benchmarks c=C/maxseq=M; default: the default alone);
// MANIFOLD_POOL_UNPAGED=0 skips the unpaged runs; MANIFOLD_POOL_STEPS, the
// batch sizes of the steps sub-benchmark (default 8,32,64,128).
func BenchmarkPoolLlama8B(b *testing.B) {
	benchPool(b, "llama3-8b", "MANIFOLD_BENCH_DIR", testmodel.Llama{Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256,
		DType: weights.BF16, NVFP4: true, Seed: 1})
}

// BenchmarkPoolQwen3_8B is BenchmarkPoolLlama8B at the Qwen3-8B shape (36
// layers, FFN 12288, q/k norms, vocab 151936). MANIFOLD_BENCH_DIR_QWEN3
// may name a folder for its checkpoint.
func BenchmarkPoolQwen3_8B(b *testing.B) {
	benchPool(b, "qwen3-8b", "MANIFOLD_BENCH_DIR_QWEN3", testmodel.Llama{Layers: 36, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128,
		Vocab: 151936, DType: weights.BF16, NVFP4: true, Qwen3: true, Seed: 1})
}

// envInts is the comma-separated integers of the environment variable
// name (benchmarks only), or def when it is unset.
func envInts(tb testing.TB, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			tb.Fatalf("%s=%q: want positive integers, comma-separated", name, v)
		}
		out = append(out, n)
	}
	return out
}

// benchPool runs the pool benchmark on spec's checkpoint (in env's folder
// where set); each pool is dropped and collected before the next, whose
// cache then has the GPU's memory (at c = 256 a cache takes 50 GB).
func benchPool(b *testing.B, name, env string, spec testmodel.Llama) {
	skipWithoutGPU(b)
	dir := benchCheckpoint(b, env, spec)
	const prompt, output = 512, 256
	m, err := Load(dir, Options{Device: "cuda", ContextLength: prompt + output})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	cs := envInts(b, "MANIFOLD_POOL_C", []int{1, 8, 32, 128, 256})
	maxSeqs := envInts(b, "MANIFOLD_POOL_MAXSEQ", []int{0})
	unpagedToo := os.Getenv("MANIFOLD_POOL_UNPAGED") != "0"
	kinds := []bool{false} // each run's PoolOptions.Unpaged: paged, then unpaged
	if unpagedToo {
		kinds = append(kinds, true)
	}
	defaultMax := m.sched.opts.MaxSequences
	defer m.sched.setMaxSequences(defaultMax)
	// runPool runs c requests of output tokens through a new pool and
	// returns the output tokens/s; seed varies the prompts.
	runPool := func(b *testing.B, c, output, seed int, unpaged bool) (float64, time.Duration) {
		p, err := m.NewPool(PoolOptions{Sessions: c, ContextLength: prompt + output, Unpaged: unpaged})
		if err != nil {
			b.Fatal(err)
		}
		rate := concurrentRate(b, c, output, func(j int) error {
			return poolRequest(p, testPrompt(seed+j, prompt, spec.Vocab), output)
		})
		p.Close()
		p = nil
		runtime.GC() // the cache's device memory goes back once collected
		runtime.GC()
		time.Sleep(200 * time.Millisecond)
		return rate, time.Duration(float64(c*output) / rate * 1e9)
	}
	// Warm-up: the first request after Load pays for what runs once (the
	// scratch's first allocations, the graphs' first captures), which
	// the c = 1 paged run, the first measured, used to pay alone.
	for _, unpaged := range kinds {
		runPool(b, 1, 32, 5000, unpaged)
	}
	m.sched.setMaxSequences(2) // a batched step of 2, so that the first timed batched steps are not the first
	runPool(b, 2, 8, 6000, false)
	m.sched.setMaxSequences(defaultMax)
	b.Run("steps", func(b *testing.B) {
		for b.Loop() {
			benchBatchSteps(b, m, name, prompt, envInts(b, "MANIFOLD_POOL_STEPS", []int{8, 32, 64, 128}))
		}
		runtime.GC() // the steps' block pool goes back before the pools'
		runtime.GC()
		time.Sleep(200 * time.Millisecond)
	})
	for _, c := range cs {
		for _, ms := range maxSeqs {
			sub := fmt.Sprintf("c=%d", c)
			if ms > 0 {
				sub += fmt.Sprintf("/maxseq=%d", ms)
			}
			b.Run(sub, func(b *testing.B) {
				m.sched.setMaxSequences(defaultMax)
				if ms > 0 {
					m.sched.setMaxSequences(ms)
				}
				defer m.sched.setMaxSequences(defaultMax)
				var rates [2]float64          // paged, unpaged
				var alone float64             // a plain Session, c = 1
				var steps, seqs, waited int64 // the paged pool's steps, their sequences, gathers that waited out Gather
				var st0, st1 stepTimes
				var wall time.Duration
				for b.Loop() {
					for i, unpaged := range kinds {
						bs0, w0, t0 := m.BatchStats(), m.sched.gatherTimeouts(), m.sched.stepTimes()
						var took time.Duration
						rates[i], took = runPool(b, c, output, 1000*i, unpaged)
						if bs := m.BatchStats(); !unpaged {
							steps, seqs, waited = bs.Steps-bs0.Steps, bs.Sequences-bs0.Sequences, m.sched.gatherTimeouts()-w0
							st0, st1, wall = t0, m.sched.stepTimes(), took
						}
					}
					if c == 1 {
						alone = aloneRate(b, m, testPrompt(2000, prompt, spec.Vocab), output)
					}
				}
				b.ReportMetric(rates[0], "paged-tok/s")
				mode := strconv.Itoa(defaultMax)
				if ms > 0 {
					mode = strconv.Itoa(ms)
				}
				if unpagedToo {
					b.ReportMetric(rates[1], "unpaged-tok/s")
					b.ReportMetric(rates[0]/rates[1], "ratio")
				}
				if c == 1 {
					b.ReportMetric(alone, "session-tok/s")
				}
				// unpaged_tok_s and ratio are "-" where the unpaged runs were
				// skipped (MANIFOLD_POOL_UNPAGED=0), session_tok_s where c > 1.
				unpaged, ratio, session := "-", "-", "-"
				if unpagedToo {
					unpaged, ratio = fmt.Sprintf("%.0f", rates[1]), fmt.Sprintf("%.2f", rates[0]/max(rates[1], 1e-9))
				}
				if c == 1 {
					session = fmt.Sprintf("%.0f", alone)
				}
				fmt.Printf("RESULT pool %s c=%d maxseq=%s paged_tok_s=%.0f unpaged_tok_s=%s ratio=%s session_tok_s=%s paged_steps=%d mean_batch=%.1f gather_timeouts=%d\n",
					name, c, mode, rates[0], unpaged, ratio, session, steps, float64(seqs)/float64(max(steps, 1)), waited)
				printStepTimes(name, c, mode, st0, st1, wall)
			})
		}
	}
}

// setMaxSequences sets BatchOptions.MaxSequences of a loaded model's
// scheduler (benchmarks, between runs).
func (s *scheduler) setMaxSequences(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.MaxSequences = n
}

// aloneRate is the output tokens/s of one request through a plain Session
// (no pool, no scheduler: the single-stream path), prefill included.
func aloneRate(b *testing.B, m *Model, ids []int, output int) float64 {
	s, err := m.NewSession(len(ids) + output)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if _, err := s.Generate(context.Background(), ids, GenerateOptions{MaxTokens: output, StopTokens: []int{}}, nil); err != nil {
		b.Fatal(err)
	}
	return float64(output) / time.Since(start).Seconds()
}

// printStepTimes prints where a paged run's wall time went (the scheduler's
// counts between t0 and t1): RESULT poolsteps.
func printStepTimes(name string, c int, mode string, t0, t1 stepTimes, wall time.Duration) {
	d := func(a, b time.Duration) time.Duration { return b - a }
	ps, ds := t1.prefillSteps-t0.prefillSteps, t1.decodeSteps-t0.decodeSteps
	pw, dw := d(t0.prefillWall, t1.prefillWall), d(t0.decodeWall, t1.decodeWall)
	steps := max(ps+ds, 1)
	us := func(a, b time.Duration) float64 { return float64(d(a, b).Microseconds()) / float64(steps) }
	gather := d(t0.gather, t1.gather)
	fmt.Printf("RESULT poolsteps %s c=%d maxseq=%s wall_s=%.2f prefill_steps=%d prefill_s=%.2f (%.0f%%) prefill_batch=%.1f prefill_rows=%.0f/step decode_steps=%d decode_s=%.2f (%.0f%%) decode_batch=%.1f decode_ms_per_step=%.2f gather_s=%.2f (%.0f%%) outside_steps_s=%.2f\n",
		name, c, mode, wall.Seconds(),
		ps, pw.Seconds(), 100*pw.Seconds()/wall.Seconds(), float64(t1.prefillSeqs-t0.prefillSeqs)/float64(max(ps, 1)), float64(t1.prefillRows-t0.prefillRows)/float64(max(ps, 1)),
		ds, dw.Seconds(), 100*dw.Seconds()/wall.Seconds(), float64(t1.decodeSeqs-t0.decodeSeqs)/float64(max(ds, 1)), dw.Seconds()*1e3/float64(max(ds, 1)),
		gather.Seconds(), 100*gather.Seconds()/wall.Seconds(), (wall - pw - dw - gather).Seconds())
	fmt.Printf("RESULT poolsteps_host %s c=%d maxseq=%s us_per_step: gather=%.0f pick=%.0f queue=%.0f read_logits=%.0f sample_wait=%.0f sync=%.0f finish=%.0f (queue: the step's ops queued and launched ahead on the host; sample_wait: the picks' launch and the wait for the device to finish the step)\n",
		name, c, mode, us(t0.gather, t1.gather), us(t0.pick, t1.pick), us(t0.queue, t1.queue), us(t0.read, t1.read),
		us(t0.sample, t1.sample), us(t0.sync, t1.sync), us(t0.finish, t1.finish))
}

// TestPoolBenchHarness runs the pool benchmark's step harness
// (benchBatchSteps) and its report (printStepTimes) on the CPU on a small
// model, with the device picks done on the host (hostPicks), so that the
// GPU benchmark's code is exercised where there is no GPU.
func TestPoolBenchHarness(t *testing.T) {
	spec := testmodel.Llama{Layers: 2, Hidden: 16, FFN: 16, Heads: 2, KVHeads: 1, Vocab: 64, DType: weights.F32, Seed: 3}
	dir := t.TempDir()
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir, Options{Device: "cpu", Threads: 1, ContextLength: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pickOnHostDevice(m, BatchOptions{})
	benchBatchSteps(t, m, "tiny", 24, []int{2, 5})
	t0 := m.sched.stepTimes()
	p, err := m.NewPool(PoolOptions{Sessions: 3, ContextLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	errs := make(chan error, 3)
	for j := range 3 {
		go func() { errs <- poolRequest(p, testPrompt(j, 20, spec.Vocab), 8) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t1 := m.sched.stepTimes()
	if st := m.BatchStats(); t1.prefillSteps+t1.decodeSteps != st.Steps {
		t.Errorf("%d steps ran, %d prefill and %d decode steps timed", st.Steps, t1.prefillSteps, t1.decodeSteps)
	}
	printStepTimes("tiny", 3, "default", t0, t1, time.Second)
}

// benchBatchSteps times the model's steps directly, without the scheduler:
// a 512-token prefill and single-stream decode steps, on a paged state and
// on a cache of its own, then batched decode steps (ForwardBatchDevice and
// the batched device picks, synchronized each step as the scheduler's are)
// of each batch size over distinct paged sequences of prompt tokens. For
// each it prints the wall time a step, the host time queueing it and the
// device time of each kernel over a few steps launched one by one
// (PROFILE lines, kernels.FormatProfile: their sum includes the gaps
// between launches).
func benchBatchSteps(b testing.TB, m *Model, name string, prompt int, sizes []int) {
	ctx := context.Background()
	gb, _ := m.Backend().(*kernels.Backend) // nil: no profile (the CPU's smoke test)
	bdf := m.net.(model.BatchDeviceForwarder)
	df := m.net.(model.DeviceForwarder)
	vocab := m.cfg.VocabSize
	ts, bs := m.caps.Sampler, m.caps.BatchSampler
	check := func(err error) {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
	}
	const extra = 160 // decode positions past the prompt
	maxB := slices.Max(sizes)
	pc, err := m.net.(model.Pager).NewPagedCache(maxB*((prompt+extra+15)/16)+16, 16)
	check(err)
	ids := func(seed int) []int32 {
		p := testPrompt(seed, prompt, vocab)
		out := make([]int32, len(p))
		for i, t := range p {
			out[i] = int32(t)
		}
		return out
	}
	profile := func(what string, steps int, run func()) {
		if gb == nil {
			for range steps {
				run()
			}
			return
		}
		gb.StartProfile()
		for range steps {
			run()
		}
		p := gb.StopProfile()
		var total time.Duration
		for _, k := range p {
			total += k.Total
		}
		fmt.Printf("PROFILE %s %s: %d steps, device time %.3f ms a step (launched one by one)\n%s", name, what, steps,
			float64(total.Microseconds())/1e3/float64(steps), kernels.FormatProfile(p))
	}
	// The single-stream path, paged and unpaged: a prefill of prompt
	// tokens, then decode steps picked on the device one at a time.
	single := func(kind string, st model.State) {
		prefill := func(st model.State, seed int) {
			logits, err := df.ForwardDevice(ctx, st, ids(seed))
			check(err)
			_, err = ts.SampleToken(logits, 0, 0, 0)
			check(err)
		}
		prefill(st, 7000) // the state's scratch is allocated by its first pass
		st.Truncate(0)
		start := time.Now()
		prefill(st, 7000)
		fmt.Printf("RESULT steps %s single-%s prefill%d_ms=%.2f\n", name, kind, prompt, float64(time.Since(start).Microseconds())/1e3)
		tok := int32(3)
		step := func() {
			logits, err := df.ForwardDevice(ctx, st, []int32{tok})
			check(err)
			id, err := ts.SampleToken(logits, 0, 0, 0)
			check(err)
			tok = int32(id)
		}
		for range 4 {
			step()
		}
		const n = 32
		start = time.Now()
		for range n {
			step()
		}
		fmt.Printf("RESULT steps %s single-%s decode_ms_per_step=%.3f (synchronous, no run ahead; at %d positions)\n", name, kind,
			float64(time.Since(start).Microseconds())/1e3/n, st.Len())
		profile("single-"+kind+" decode", 8, step)
		st.Truncate(0)
		profile(fmt.Sprintf("single-%s prefill%d", kind, prompt), 1, func() { prefill(st, 7000) })
	}
	pst, err := pc.NewState(prompt + extra)
	check(err)
	single("paged", pst)
	pst.Truncate(0)
	ust, err := m.net.NewState(prompt + extra)
	check(err)
	single("unpaged", ust)
	ust = nil

	// Batched decode steps over maxB paged sequences prefilled one by one.
	sts := make([]model.State, maxB)
	next := make([][]int32, maxB)
	start := time.Now()
	for i := range sts {
		st, err := pc.NewState(prompt + extra)
		check(err)
		sts[i] = st
		_, err = bdf.ForwardBatchDevice(ctx, sts[i:i+1], [][]int32{ids(8000 + i)})
		check(err)
		next[i] = []int32{int32(2 + i)}
	}
	check(m.backend.Sync())
	fmt.Printf("RESULT steps %s batched prefill of %d x %d tokens: %.0f tok/s\n", name, maxB, prompt, float64(maxB*prompt)/time.Since(start).Seconds())
	var bw float64 // the device's copy bandwidth, bytes/s (0: not measured)
	if gb != nil {
		bw = gb.CopyBandwidth()
	}
	perPos := pc.BlockBytes() / int64(pc.BlockSize())
	var queued, picked time.Duration
	step := func(B int) {
		t0 := time.Now()
		logits, err := bdf.ForwardBatchDevice(ctx, sts[:B], next[:B])
		check(err)
		t1 := time.Now()
		picks := make([]backend.SamplePick, B)
		for i := range picks {
			picks[i].Row = i
		}
		got := make([]int, B)
		check(bs.SampleTokens(got, logits, vocab, picks))
		check(m.backend.Sync())
		queued += t1.Sub(t0)
		picked += time.Since(t1)
		for i, id := range got {
			next[i][0] = int32(id)
		}
	}
	for _, B := range sizes {
		for range 3 {
			step(B)
		}
		const n = 10
		queued, picked = 0, 0
		start := time.Now()
		for range n {
			step(B)
		}
		wall := time.Since(start)
		fmt.Printf("RESULT steps %s batch=%d step_ms=%.3f decode_tok_s=%.0f host_queue_ms=%.3f pick_and_wait_ms=%.3f (at ~%d positions)\n", name, B,
			float64(wall.Microseconds())/1e3/n, float64(B*n)/wall.Seconds(), float64(queued.Microseconds())/1e3/n, float64(picked.Microseconds())/1e3/n, sts[0].Len())
		if bw > 0 {
			// What a step must read: every weight but the embedding's
			// (the bf16 table, of which a row a token is read), and each
			// sequence's keys and values (float32) at every layer.
			var kv int64
			for _, st := range sts[:B] {
				kv += int64(st.Len()) * perPos
			}
			w := m.info.CheckpointBytes - int64(vocab)*int64(m.cfg.HiddenSize)*2
			floor := float64(w+kv) / bw
			fmt.Printf("RESULT steps %s batch=%d floor: weights %.2f GB + kv %.2f GB at %.0f GB/s = %.3f ms a step (%.0f tok/s); the step ran at %.0f%% of it\n",
				name, B, float64(w)/1e9, float64(kv)/1e9, bw/1e9, floor*1e3, float64(B)/floor, 100*floor/(wall.Seconds()/n))
		}
		profile(fmt.Sprintf("batch=%d decode", B), 3, func() { step(B) })
	}
	for _, st := range sts {
		st.Truncate(0)
	}
}
