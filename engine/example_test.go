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
