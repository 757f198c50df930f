package engine_test

import (
	"context"
	"fmt"
	"os"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// Load a model folder, open a session and stream sampled tokens.
func Example() {
	// Any model folder works; a tiny random Llama stands in for one here.
	dir, err := os.MkdirTemp("", "manifold-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 128, Heads: 4, KVHeads: 2, Vocab: 256, DType: weights.BF16}
	if err := spec.Write(dir); err != nil {
		fmt.Println(err)
		return
	}

	m, err := engine.Load(dir, engine.Options{Device: "cpu"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()

	s, err := m.NewSession(256)
	if err != nil {
		fmt.Println(err)
		return
	}
	prompt := []int{1, 2, 3, 4}
	n := 0
	res, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{
		MaxTokens:  8,
		StopTokens: []int{}, // ignore EOS: always 8 tokens
		Sampling:   engine.SamplingOptions{Temperature: 0.7, TopP: 0.9, Seed: 42},
	}, func(tok engine.Token) error {
		n++ // a real program prints tok.ID (or its text) as it arrives
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(n, "tokens streamed; stopped on", res.Reason)
	// Output: 8 tokens streamed; stopped on max tokens
}

// Check sampling options before use, for example those read from a request.
func ExampleSamplingOptions_Validate() {
	opts := engine.SamplingOptions{Temperature: 0.7, TopP: 1.5}
	if err := opts.Validate(); err != nil {
		fmt.Println(err)
	}
	// Output: engine: sampling option TopP 1.5: want a number in [0, 1] (0 or 1: off)
}
