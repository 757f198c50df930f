package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/manifoldlm/manifold/engine"
)

// Load a model folder, open a session and stream greedy tokens.
func Example() {
	// The test fixtures' tiny Llama (MANIFOLD_GOLDEN_DIR, relative to the
	// module root, default ../shared/golden); any model folder works.
	fixtures := os.Getenv("MANIFOLD_GOLDEN_DIR")
	if fixtures == "" {
		fixtures = filepath.Join("..", "shared", "golden")
	}
	if !filepath.IsAbs(fixtures) {
		fixtures = filepath.Join("..", fixtures)
	}
	dir := filepath.Join(fixtures, "llama")
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
