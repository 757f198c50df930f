package testmodel

import (
	"fmt"
	"slices"
	"strings"

	"github.com/manifoldlm/manifold/weights"
)

// Shapes are the real model shapes a random checkpoint can take, by name.
// Their linears are random NVFP4 (as the decode benchmarks use them) unless
// the name says bf16.
var shapes = map[string]Llama{
	"llama3-8b":   {Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, Vocab: 128256, DType: weights.BF16, NVFP4: true, Seed: 1},
	"llama3.2-1b": {Layers: 16, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 128256, DType: weights.BF16, NVFP4: true, Seed: 1},
	"qwen3-8b": {Layers: 36, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 151936, Theta: 1e6,
		Qwen3: true, DType: weights.BF16, NVFP4: true, Seed: 1},
	// Two layers of Qwen3-8B in bf16 with a 4096-token vocabulary: the
	// long-position RoPE test's model (engine/testdata/longrope).
	"qwen3-8b-2l-bf16": {Layers: 2, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128, Vocab: 4096, Theta: 1e6,
		Qwen3: true, DType: weights.BF16, Seed: 54},
}

// Shape returns the named shape (see ShapeNames).
func Shape(name string) (Llama, error) {
	s, ok := shapes[name]
	if !ok {
		return Llama{}, fmt.Errorf("testmodel: unknown shape %q (known: %s)", name, strings.Join(ShapeNames(), ", "))
	}
	return s, nil
}

// ShapeNames lists the named shapes, sorted.
func ShapeNames() []string {
	names := make([]string, 0, len(shapes))
	for k := range shapes {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
