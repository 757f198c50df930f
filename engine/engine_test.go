package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

func loadGolden(t testing.TB, arch string) (*Model, *golden.Reference) {
	t.Helper()
	dir := golden.Path(t, arch)
	m, err := Load(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, golden.Load(t, dir)
}

// openSession loads dir with o and opens a session of its default length;
// the model closes when the test ends.
func openSession(t testing.TB, dir string, o Options) (*Model, *Session) {
	t.Helper()
	m, err := Load(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := m.NewSession(0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

func ints(v []int32) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}

func TestGreedyMatchesGolden(t *testing.T) {
	for _, arch := range []string{"llama", "qwen3"} {
		t.Run(arch, func(t *testing.T) {
			m, ref := loadGolden(t, arch)
			s, err := m.NewSession(0)
			if err != nil {
				t.Fatal(err)
			}
			var streamed []int
			res, err := s.Generate(context.Background(), ints(ref.InputIDs[:20]),
				GenerateOptions{MaxTokens: len(ref.GreedyTokens), StopTokens: []int{}},
				func(tok Token) error { streamed = append(streamed, tok.ID); return nil })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Tokens, ints(ref.GreedyTokens)) || !slices.Equal(streamed, res.Tokens) {
				t.Fatalf("greedy:\n got %v (streamed %v)\nwant %v", res.Tokens, streamed, ref.GreedyTokens)
			}
			if res.Reason != StopMaxTokens {
				t.Errorf("reason %q", res.Reason)
			}
			// The session continues where it stopped: the same as one long greedy run.
			more, err := s.Generate(context.Background(), nil, GenerateOptions{MaxTokens: 3, StopTokens: []int{}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			s2, _ := m.NewSession(0)
			all, _ := s2.Generate(context.Background(), ints(ref.InputIDs[:20]), GenerateOptions{MaxTokens: len(ref.GreedyTokens) + 3, StopTokens: []int{}}, nil)
			if !slices.Equal(append(res.Tokens, more.Tokens...), all.Tokens) {
				t.Errorf("continued generation %v + %v != %v", res.Tokens, more.Tokens, all.Tokens)
			}
		})
	}
}

// TestConcurrentSessions runs sessions of one model in parallel (run with -race).
func TestConcurrentSessions(t *testing.T) {
	m, ref := loadGolden(t, "llama")
	prompt := ints(ref.InputIDs[:20])
	var wg sync.WaitGroup
	results := make([][]int, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.NewSession(64)
			if err != nil {
				errs[i] = err
				return
			}
			r, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 8, StopTokens: []int{},
				Sampling: SamplingOptions{Temperature: 0.8, TopK: 40, TopP: 0.95, Seed: uint64(i % 2)}}, nil)
			if err != nil {
				errs[i] = err
				return
			}
			results[i] = r.Tokens
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(results[0], results[2]) || !slices.Equal(results[1], results[3]) {
		t.Errorf("same seed, different tokens: %v", results)
	}
}

func TestCancellation(t *testing.T) {
	m, ref := loadGolden(t, "llama")
	s, _ := m.NewSession(0)
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	res, err := s.Generate(ctx, ints(ref.InputIDs[:10]), GenerateOptions{MaxTokens: 50}, func(Token) error {
		if n++; n == 3 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(res.Tokens) != 3 {
		t.Errorf("%d tokens after cancel at the third", len(res.Tokens))
	}
	// A cancelled prefill leaves the session untouched.
	before := s.Len()
	if _, err := s.Append(ctx, ints(ref.InputIDs[:5])); !errors.Is(err, context.Canceled) || s.Len() != before {
		t.Errorf("append after cancel: err %v, len %d -> %d", err, before, s.Len())
	}
}

func TestBadInput(t *testing.T) {
	m, ref := loadGolden(t, "llama")
	s, _ := m.NewSession(16)
	ctx := context.Background()
	if _, err := s.Generate(ctx, ints(ref.InputIDs[:17]), GenerateOptions{}, nil); !errors.Is(err, ErrContextFull) {
		t.Errorf("prompt longer than context: %v", err)
	}
	if _, err := s.Append(ctx, []int{m.Config().VocabSize}); err == nil {
		t.Error("token outside the vocabulary accepted")
	}
	res, err := s.Generate(ctx, ints(ref.InputIDs[:10]), GenerateOptions{StopTokens: []int{}}, nil)
	if err != nil || res.Reason != StopContext || s.Len() != 16 {
		t.Errorf("generation to a full context: %v, reason %q, len %d", err, res.Reason, s.Len())
	}
	// A context whose cache exceeds the machine's memory: an error, not the
	// runtime's fatal out-of-memory (the CPU backend knows its memory on Linux).
	if mem, ok := m.backend.(interface{ MemoryBytes() int64 }); ok && mem.MemoryBytes() > 0 {
		if _, err := m.NewSession(math.MaxInt32); err == nil || !strings.Contains(err.Error(), "positions") {
			t.Errorf("a session of 2^31-1 positions: %v", err)
		}
	}
	if _, err := Load(t.TempDir(), Options{}); err == nil {
		t.Error("empty folder loaded")
	}
	for _, o := range []Options{{Threads: -1}, {ContextLength: -5}} {
		if _, err := Load(golden.Path(t, "llama"), o); err == nil {
			t.Errorf("%+v: loaded", o)
		}
	}
	if _, err := Load(golden.Path(t, "llama"), Options{Device: "tpu"}); !errors.Is(err, ErrDevice) {
		t.Errorf("unknown device: %v", err)
	}
}

// TestBadOptions: options out of range are errors naming the option, from
// Validate and from Generate before anything runs.
func TestBadOptions(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		o     SamplingOptions
		field string // "" for valid options
	}{
		{SamplingOptions{}, ""},
		{SamplingOptions{Temperature: 0.7, TopK: 40, TopP: 0.95, MinP: 0.05, RepetitionPenalty: 1.1}, ""},
		{SamplingOptions{TopP: 1, MinP: 1}, ""},
		{SamplingOptions{Temperature: -1}, "Temperature"},
		{SamplingOptions{Temperature: nan}, "Temperature"},
		{SamplingOptions{Temperature: inf}, "Temperature"},
		{SamplingOptions{TopK: -1}, "TopK"},
		{SamplingOptions{TopP: 1.5}, "TopP"},
		{SamplingOptions{TopP: nan}, "TopP"},
		{SamplingOptions{TopP: -0.1}, "TopP"},
		{SamplingOptions{MinP: 2}, "MinP"},
		{SamplingOptions{MinP: nan}, "MinP"},
		{SamplingOptions{RepetitionPenalty: -1}, "RepetitionPenalty"},
		{SamplingOptions{RepetitionPenalty: inf}, "RepetitionPenalty"},
	} {
		err := tc.o.Validate()
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("%+v: error %v, want one naming %s", tc.o, err, tc.field)
		}
	}
	m, ref := loadGolden(t, "llama")
	s, _ := m.NewSession(32)
	ctx := context.Background()
	for _, o := range []GenerateOptions{{MaxTokens: -1}, {Sampling: SamplingOptions{TopP: nan}}} {
		if _, err := s.Generate(ctx, ints(ref.InputIDs[:4]), o, nil); err == nil || s.Len() != 0 {
			t.Errorf("%+v: error %v, session length %d", o, err, s.Len())
		}
	}
}

func TestSampler(t *testing.T) {
	logits := func() []float32 { return []float32{1, 3, 2, 3, -1} }
	if got := NewSampler(SamplingOptions{}).Sample(logits(), nil); got != 1 {
		t.Errorf("greedy picked %d, want the first maximum 1", got)
	}
	if got := NewSampler(SamplingOptions{Temperature: 1, TopK: 1}).Sample(logits(), nil); got != 1 && got != 3 {
		t.Errorf("top-k 1 picked %d", got)
	}
	// Repetition penalty 2 halves positive logits once per distinct token.
	l := logits()
	NewSampler(SamplingOptions{RepetitionPenalty: 2}).Sample(l, []int{1, 1, 4})
	if !slices.Equal(l, []float32{1, 1.5, 2, 3, -2}) {
		t.Errorf("penalized logits %v", l)
	}
	// Min-p 0.5 keeps only tokens at least half as likely as the best.
	s := NewSampler(SamplingOptions{Temperature: 1, MinP: 0.5, Seed: 7})
	for range 200 {
		if id := s.Sample(logits(), nil); id != 1 && id != 3 {
			t.Fatalf("min-p let token %d through", id)
		}
	}
	// Top-p 0.5 over {0.5, 0.3, 0.2} keeps only the first.
	p := []float32{float32(math.Log(0.5)), float32(math.Log(0.3)), float32(math.Log(0.2))}
	s = NewSampler(SamplingOptions{Temperature: 1, TopP: 0.5, Seed: 1})
	for range 100 {
		if id := s.Sample(slices.Clone(p), nil); id != 0 {
			t.Fatalf("top-p let token %d through", id)
		}
	}
}

func TestRandomModelLoads(t *testing.T) {
	s := randomModelGenerates(t, false, Options{ContextLength: 32})
	if got, want := s.CacheBytesPerToken(), int64(2*2*2*16*4); got != want {
		t.Errorf("cache bytes per token %d, want %d", got, want)
	}
}

func TestRandomNVFP4ModelLoads(t *testing.T) {
	randomModelGenerates(t, true, Options{ContextLength: 32, Device: "cpu"})
}

// randomModelGenerates loads a small random Llama (NVFP4 linears or not)
// with o, checks that a session of it generates 4 tokens and returns it.
func randomModelGenerates(t *testing.T, nvfp4 bool, o Options) *Session {
	t.Helper()
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.BF16, NVFP4: nvfp4, Seed: 3}
	_, s := openSession(t, testmodel.WriteTemp(t, spec), o)
	if res, err := s.Generate(context.Background(), []int{5, 6, 7}, GenerateOptions{MaxTokens: 4, StopTokens: []int{}}, nil); err != nil || len(res.Tokens) != 4 {
		t.Fatalf("%v %v", res, err)
	}
	return s
}

// TestNaNLogitsAreAnError: a checkpoint whose final norm holds a NaN makes
// every logit NaN; Generate says so instead of drawing a token from them.
func TestNaNLogitsAreAnError(t *testing.T) {
	src, dir := t.TempDir(), t.TempDir()
	spec := testmodel.Llama{Layers: 1, Hidden: 32, FFN: 48, Heads: 2, KVHeads: 1, Vocab: 40, DType: weights.F32, Seed: 4}
	if err := spec.Write(src); err != nil {
		t.Fatal(err)
	}
	err := testmodel.Rewrite(src, dir, func(tn *weights.Tensor) *weights.Tensor {
		if tn.Name == "model.norm.weight" {
			tn.Data = slices.Clone(tn.Data)
			binary.LittleEndian.PutUint32(tn.Data[4:], math.Float32bits(float32(math.NaN())))
		}
		return tn
	})
	if err != nil {
		t.Fatal(err)
	}
	_, s := openSession(t, dir, Options{Device: "cpu"})
	_, err = s.Generate(context.Background(), []int{1, 2}, GenerateOptions{MaxTokens: 3}, nil)
	if err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Fatalf("Generate over NaN logits: %v, want an error naming NaN", err)
	}
}
