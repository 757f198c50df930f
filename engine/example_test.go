package engine_test

import (
	"context"
	"fmt"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
	"log"
	"math"
	"os"
	"sync"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/engine/builtin"
)

// Load a model, open a session and stream sampled tokens. The built-in
// model stands in for a model folder (engine.Load(dir, opts) loads one).
func Example() {
	m, err := builtin.Load(engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	prompt, err := m.Encode("func main() {", false)
	if err != nil {
		log.Fatal(err)
	}
	s, err := m.NewSession(256)
	if err != nil {
		log.Fatal(err)
	}
	n := 0
	res, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{
		MaxTokens:  8,
		StopTokens: []int{}, // ignore EOS: always 8 tokens
		Sampling:   engine.SamplingOptions{Temperature: 0.7, TopP: 0.9, Seed: 42},
	}, func(tok engine.Token) error {
		n++ // a real program prints tok.Text as it arrives
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(n, "tokens streamed; stopped on", res.Reason)
	// Output: 8 tokens streamed; stopped on max tokens
}

// The code of README.md's "Use it as a library", which TestReadmeExample
// keeps equal to this function's body. It needs a chat model's folder, so it
// runs only where path/to/Qwen3-0.6B is one.
func Example_library() {
	ctx := context.Background()
	m, err := builtin.Load(engine.Options{}) // the built-in model; engine.Load(dir, opts) loads a model folder
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	// Text in, text out, streamed as it is generated.
	s, err := m.NewSession(0) // one conversation: its tokens and KV cache
	if err != nil {
		log.Fatal(err)
	}
	res, err := s.GenerateText(ctx, "func main() {", engine.GenerateOptions{
		MaxTokens:   128,
		StopStrings: []string{"\n}\n"}, // optional: the text ends before this string
		Sampling:    engine.SamplingOptions{Temperature: 0.7, TopP: 0.9, Seed: 1},
	}, func(t engine.Token) error { fmt.Print(t.Text); return nil })
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\n%d tokens (%s); the session goes on from here\n", len(res.Tokens), res.Reason)

	// Or range over the tokens, with the model's log-probability of each.
	ids, err := m.Encode("package main", false)
	if err != nil {
		log.Fatal(err)
	}
	s2, err := m.NewSession(0)
	if err != nil {
		log.Fatal(err)
	}
	for t, err := range s2.Stream(ctx, ids, engine.GenerateOptions{MaxTokens: 16, LogProbs: true}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%q %.2f\n", t.Text, t.LogProb)
	}

	// A chat model: a folder whose tokenizer_config.json has a chat template.
	chat, err := engine.Load("path/to/Qwen3-0.6B", engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer chat.Close()
	reply, err := chat.Chat(ctx, []engine.Message{
		{Role: "system", Content: "You answer in one sentence."},
		{Role: "user", Content: "Write a haiku about Go."},
	}, engine.GenerateOptions{MaxTokens: 256})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(reply.Text)
}

// Generate text from a text prompt, printing it as it comes.
func ExampleSession_GenerateText() {
	m, err := builtin.Load(engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	res, err := s.GenerateText(ctx, "// Sum returns the sum of xs.\nfunc Sum(xs []int) int {", engine.GenerateOptions{
		MaxTokens:   64,
		StopStrings: []string{"\n}\n"}, // the end of the function
	}, func(t engine.Token) error {
		fmt.Print(t.Text)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("\n[%d tokens, %s]\n", len(res.Tokens), res.Reason)

	// The session goes on from there.
	if _, err := s.GenerateText(ctx, "\n\nfunc Max(xs []int) int {", engine.GenerateOptions{MaxTokens: 32},
		func(t engine.Token) error { fmt.Print(t.Text); return nil }); err != nil {
		log.Fatal(err)
	}
}

// Range over the tokens as they are generated, with their
// log-probabilities; breaking out of the loop (here at the first token the
// model gave less than even odds) stops generation.
func ExampleSession_Stream() {
	m, err := builtin.Load(engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	prompt, err := m.Encode("package main\n\nimport (", false)
	if err != nil {
		log.Fatal(err)
	}
	s, err := m.NewSession(0)
	if err != nil {
		log.Fatal(err)
	}
	opts := engine.GenerateOptions{MaxTokens: 16, LogProbs: true, TopLogProbs: 3}
	for tok, err := range s.Stream(context.Background(), prompt, opts) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%q p=%.2f, the likeliest %d tokens:", tok.Text, math.Exp(float64(tok.LogProb)), len(tok.TopLogProbs))
		for _, alt := range tok.TopLogProbs {
			text, _ := m.Decode([]int{alt.ID})
			fmt.Printf(" %q %.2f", text, math.Exp(float64(alt.LogProb)))
		}
		fmt.Println()
		if tok.LogProb < float32(math.Log(0.5)) {
			break
		}
	}
}

// Chat with a model whose folder has a chat template (the built-in model,
// which completes Go code, has none): a system message, a reply, and a second
// turn that runs only its new tokens.
func ExampleSession_Chat() {
	m, err := engine.Load("path/to/Qwen3-0.6B", engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession(0)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	opts := engine.GenerateOptions{MaxTokens: 256, Sampling: engine.SamplingOptions{Temperature: 0.6, TopP: 0.95, Seed: 1}}
	print := func(t engine.Token) error { fmt.Print(t.Text); return nil }
	conv := []engine.Message{
		{Role: "system", Content: "You answer in one sentence."},
		{Role: "user", Content: "What is a goroutine?"},
	}
	res, err := s.Chat(ctx, conv, opts, print)
	if err != nil {
		log.Fatal(err)
	}
	conv = append(conv, engine.Message{Role: "assistant", Content: res.Text},
		engine.Message{Role: "user", Content: "And a channel?"})
	if _, err := s.Chat(ctx, conv, opts, print); err != nil {
		log.Fatal(err)
	}
}

// Check sampling options before use, for example those read from a request.
func ExampleSamplingOptions_Validate() {
	opts := engine.SamplingOptions{Temperature: 0.7, TopP: 1.5}
	if err := opts.Validate(); err != nil {
		fmt.Println(err)
	}
	// Output: engine: sampling option TopP 1.5: want a number in [0, 1] (0 or 1: off)
}

// Describe a model: its architecture, size and memory.
func ExampleModel_Info() {
	m, err := builtin.Load(engine.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	in := m.Info()
	fmt.Printf("%s, %.1fM parameters in %s, %.1f MB of weights\n",
		in.Architecture, float64(in.Parameters)/1e6, in.Quantization, float64(in.CheckpointBytes)/1e6)
	// Output: deepseek_v4, 8.4M parameters in NVFP4, 8.5 MB of weights
}

// Sessions that generate at once are batched: the scheduler runs their
// steps as one forward pass (continuous batching), so 64 concurrent
// Generate calls read each weight once a step, not 64 times, with no change
// to the calling code. A small random Llama stands in for a model folder.
func Example_concurrent() {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 128, DType: weights.BF16, Seed: 1}
	if err := spec.Write(dir); err != nil {
		log.Fatal(err)
	}
	m, err := engine.Load(dir, engine.Options{Device: "cpu"})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	var wg sync.WaitGroup
	results := make([]*engine.Result, 64)
	for i := range results {
		wg.Add(1)
		go func() { // each goroutine: its own session, the plain Generate call
			defer wg.Done()
			s, err := m.NewSession(128)
			if err != nil {
				log.Fatal(err)
			}
			prompt := []int{2 + i, 3 + i, 4 + i}
			results[i], err = s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 16, StopTokens: []int{}}, nil)
			if err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()
	tokens := 0
	for _, r := range results {
		tokens += len(r.Tokens)
	}
	st := m.BatchStats()
	fmt.Println(tokens, "tokens generated; batched:", st.Sequences > 2*st.Steps)
	// Output: 1024 tokens generated; batched: true
}
