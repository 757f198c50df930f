package engine_test

import (
	"context"
	"fmt"
	"log"

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
