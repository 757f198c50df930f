package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/weights"
)

// batchModel loads a small random Llama (or Qwen3) on the CPU twice:
// batched (the default) and with the scheduler off.
func batchModel(t testing.TB, qwen3 bool) (batched, alone *Model) {
	return batchModelOn(t, qwen3, "cpu")
}

func batchModelOn(t testing.TB, qwen3 bool, device string) (batched, alone *Model) {
	t.Helper()
	dir := t.TempDir()
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 128, DType: weights.BF16, Qwen3: qwen3, Seed: 11}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	var err error
	if batched, err = Load(dir, Options{Device: device, Threads: 2}); err != nil {
		t.Fatal(err)
	}
	if alone, err = Load(dir, Options{Device: device, Threads: 2, Batch: BatchOptions{Off: true}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { batched.Close(); alone.Close() })
	return batched, alone
}

// testPrompt is n tokens of seed in [2, vocab).
func testPrompt(seed, n, vocab int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = 2 + (seed*37+i*13)%(vocab-2)
	}
	return p
}

// mixedPrompts are prompts of lengths 1 to 300 tokens (index 2 longer than
// a step's token budget, so its prefill is chunked) in [2, vocab), prompt 4
// starting with prompt 3's first shared tokens.
func mixedPrompts(vocab, shared int) [][]int {
	lengths := []int{1, 7, 300, 20, 20, 3, 60, 9}
	prompts := make([][]int, len(lengths))
	for i, n := range lengths {
		prompts[i] = testPrompt(i, n, vocab)
	}
	prompts[4] = append(slices.Clone(prompts[3][:shared]), prompts[4][:5]...)
	return prompts
}

// sessionTokens is concurrentTokens' gen that generates each prompt with
// opts in a new session of m of capacity positions.
func sessionTokens(m *Model, capacity int, opts GenerateOptions) func(int, []int) ([]int, error) {
	return func(_ int, p []int) ([]int, error) {
		s, err := m.NewSession(capacity)
		if err != nil {
			return nil, err
		}
		res, err := s.Generate(context.Background(), p, opts, nil)
		if err != nil {
			return nil, err
		}
		return res.Tokens, nil
	}
}

// aloneTokens generates each prompt with opts(i) in a session of its own
// (512 positions) of m, one after another.
func aloneTokens(t *testing.T, m *Model, prompts [][]int, opts func(i int) GenerateOptions) [][]int {
	t.Helper()
	want := make([][]int, len(prompts))
	for i, p := range prompts {
		s, err := m.NewSession(512)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Generate(context.Background(), p, opts(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = res.Tokens
	}
	return want
}

// concurrentTokens runs gen for every prompt at once, the goroutines
// joining up to 6 ms apart (mid-run), and returns what each generated (nil
// where gen failed, the error reported).
func concurrentTokens(t *testing.T, prompts [][]int, gen func(i int, p []int) ([]int, error)) [][]int {
	got := make([][]int, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i%3) * 3 * time.Millisecond) // join mid-run
			toks, err := gen(i, p)
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = toks
		}()
	}
	wg.Wait()
	return got
}

// TestBatchedGenerateMatchesAlone: sessions generating at once, joining at
// different times with prompts of different lengths (one longer than a
// step's token budget, so its prefill is chunked between the others'
// decode steps; two sharing a prefix), each give the tokens they give
// alone, and their steps were batched. On the GPU (skipped without one)
// "alone" picks each token on the device with the single-row sampler, the
// batched steps with the batched one (backend.BatchTokenSampler).
func TestBatchedGenerateMatchesAlone(t *testing.T) {
	for _, tc := range []struct {
		device string
		qwen3  bool
	}{{"cpu", false}, {"cpu", true}, {"cuda", false}, {"cuda", true}} {
		t.Run(fmt.Sprintf("%s/qwen3=%v", tc.device, tc.qwen3), func(t *testing.T) {
			if tc.device == "cuda" && !kernels.Available() {
				t.Skip("no CUDA driver or GPU")
			}
			batched, alone := batchModelOn(t, tc.qwen3, tc.device)
			vocab := batched.Config().VocabSize
			prompts := mixedPrompts(vocab, 15) // 4 shares 15 tokens with 3
			opts := GenerateOptions{MaxTokens: 24, StopTokens: []int{}}
			want := aloneTokens(t, alone, prompts, func(int) GenerateOptions { return opts })
			untilBatched(t, batched, func() {
				got := concurrentTokens(t, prompts, sessionTokens(batched, 512, opts))
				for i := range prompts {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("session %d (%d prompt tokens): batched %v, alone %v", i, len(prompts[i]), got[i], want[i])
					}
				}
			})
			st := batched.BatchStats()
			if st.Active != 0 || st.Queued != 0 {
				t.Errorf("sessions left behind: %+v", st)
			}
			t.Logf("%+v: mean batch %.1f", st, float64(st.Sequences)/float64(st.Steps))
		})
	}
}

// TestBatchedCancel: a session cancelled mid-generation stops with ctx's
// error and keeps its tokens; the others finish with their own tokens.
func TestBatchedCancel(t *testing.T) {
	batched, alone := batchModel(t, false)
	vocab := batched.Config().VocabSize
	opts := GenerateOptions{MaxTokens: 40, StopTokens: []int{}}
	want := func(p []int) []int {
		s, _ := alone.NewSession(256)
		res, err := s.Generate(context.Background(), p, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := testPrompt(i, 5+i, vocab)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := batched.NewSession(256)
			if err != nil {
				t.Error(err)
				return
			}
			res, err := s.Generate(ctx, p, opts, func(tok Token) error {
				if i%2 == 1 && tok.Index == 5 {
					cancel()
				}
				return nil
			})
			if i%2 == 1 {
				if !errors.Is(err, context.Canceled) || len(res.Tokens) != 6 || s.Len() != len(p)+6 {
					t.Errorf("cancelled session %d: %v, %d tokens, session holds %d", i, err, len(res.Tokens), s.Len())
				}
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			if w := want(p); !slices.Equal(res.Tokens, w) {
				t.Errorf("session %d: %v, alone %v", i, res.Tokens, w)
			}
		}()
	}
	wg.Wait()
	if st := batched.BatchStats(); st.Active != 0 || st.Queued != 0 {
		t.Errorf("sessions left behind: %+v", st)
	}
}

func TestBatchOptionsValidate(t *testing.T) {
	for _, o := range []BatchOptions{{MaxSequences: -1}, {StepTokens: -2}} {
		if err := o.validate(); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// BenchmarkBatchedDecode is the output tokens/s of c sessions decoding at
// once, batched and alone (Options.Batch.Off), on a small model on the CPU.
func BenchmarkBatchedDecode(b *testing.B) {
	benchBatched(b, "cpu", testmodel.Llama{Layers: 4, Hidden: 512, FFN: 1536, Heads: 8, KVHeads: 2, Vocab: 8192, DType: weights.BF16, Seed: 1}, []int{1, 8, 32})
}

// BenchmarkBatchedDecodeGPU is BenchmarkBatchedDecode on the GPU at the
// Llama-3.2-1B shape (NVFP4), up to 64 sessions.
func BenchmarkBatchedDecodeGPU(b *testing.B) {
	skipWithoutGPU(b)
	spec, err := testmodel.Shape("llama3.2-1b")
	if err != nil {
		b.Fatal(err)
	}
	benchBatched(b, "cuda", spec.Model.(testmodel.Llama), []int{1, 8, 32, 64})
}

// benchBatched is, for each count c of sessions decoding 32 greedy tokens at
// once, the output tokens/s batched and alone (Options.Batch.Off), in
// rounds that alternate the two (7 a benchmark iteration), so that a
// shared machine's load falls on both: best and median of each, and their
// ratios.
func benchBatched(b *testing.B, device string, spec testmodel.Llama, levels []int) {
	dir := b.TempDir()
	if err := spec.Write(dir); err != nil {
		b.Fatal(err)
	}
	var models [2]*Model // batched, alone
	for i, off := range []bool{false, true} {
		m, err := Load(dir, Options{Device: device, ContextLength: 256, Batch: BatchOptions{Off: off}})
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		models[i] = m
	}
	const tokens, rounds = 32, 7
	for _, c := range levels {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			var rates [2][]float64
			for b.Loop() {
				for range rounds {
					for i, m := range models {
						rate := concurrentRate(b, c, tokens, func(j int) error {
							s, err := m.NewSession(0)
							if err != nil {
								return err
							}
							_, err = s.Generate(context.Background(), testPrompt(j, 8, spec.Vocab), GenerateOptions{MaxTokens: tokens, StopTokens: []int{}}, nil)
							return err
						})
						rates[i] = append(rates[i], rate)
					}
				}
			}
			for i, name := range []string{"batched", "alone"} {
				slices.Sort(rates[i])
				b.ReportMetric(rates[i][len(rates[i])-1], name+"-best-tok/s")
				b.ReportMetric(rates[i][len(rates[i])/2], name+"-median-tok/s")
			}
			b.ReportMetric(rates[0][len(rates[0])-1]/rates[1][len(rates[1])-1], "ratio-best")
			b.ReportMetric(rates[0][len(rates[0])/2]/rates[1][len(rates[1])/2], "ratio-median")
		})
	}
}

// concurrentRate runs gen(j) for every j in [0, c) at once, each
// generating tokens, and returns the output tokens/s of them all (an error
// from gen is reported to b).
func concurrentRate(b *testing.B, c, tokens int, gen func(j int) error) float64 {
	start := time.Now()
	var wg sync.WaitGroup
	for j := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := gen(j); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	return float64(c*tokens) / time.Since(start).Seconds()
}

// TestBatchedNoGatherStall: the session whose goroutine runs the steps
// (scheduler.loop) does not make a step wait for its own next tokens once
// its request is done (they cannot come before it leaves the loop): with
// prompts longer than a step's budget, so that other requests are still
// queued when the runner's ends, and a Gather of a minute, no gather ends
// at its deadline and the tokens are those of each session alone.
func TestBatchedNoGatherStall(t *testing.T) {
	dir := t.TempDir()
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 128, DType: weights.BF16, Seed: 11}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	batched, err := Load(dir, Options{Device: "cpu", Threads: 2, Batch: BatchOptions{StepTokens: 16, Gather: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer batched.Close()
	alone, err := Load(dir, Options{Device: "cpu", Threads: 2, Batch: BatchOptions{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	prompts := make([][]int, 6)
	for i := range prompts {
		prompts[i] = testPrompt(i, 40+3*i, spec.Vocab)
	}
	opts := GenerateOptions{MaxTokens: 8, StopTokens: []int{}}
	want := aloneTokens(t, alone, prompts, func(int) GenerateOptions { return opts })
	untilBatched(t, batched, func() {
		done := make(chan [][]int)
		go func() {
			done <- concurrentTokens(t, prompts, sessionTokens(batched, 128, opts))
		}()
		var got [][]int
		select {
		case got = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("stalled: %+v, %d gathers ended at the deadline", batched.BatchStats(), batched.sched.gatherTimeouts())
		}
		for i := range prompts {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("session %d: batched %v, alone %v", i, got[i], want[i])
			}
		}
		if n := batched.sched.gatherTimeouts(); n != 0 {
			t.Errorf("%d gathers ended at the Gather deadline", n)
		}
	})
}

// untilBatched runs round (sessions generating at once on m, checking their
// own results) until m's counts show a step that ran more than one
// sequence, at most 10 times. Whether the sessions' goroutines overlap is
// up to the OS: on a loaded machine a tiny model's sessions can each end
// before the next one starts, so one round alone cannot promise a batch.
func untilBatched(t *testing.T, m *Model, round func()) {
	t.Helper()
	for range 10 {
		round()
		if t.Failed() {
			return
		}
		if st := m.BatchStats(); st.Steps > 0 && st.Sequences > st.Steps {
			return
		}
	}
	t.Errorf("no step was batched in 10 rounds: %+v", m.BatchStats())
}
