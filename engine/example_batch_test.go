package engine_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sync"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

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
