package engine

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// TestCopyWeights: a model loaded with Options.CopyWeights generates what a
// mapped one does, and goes on doing so after its weight file is truncated
// (which would kill a process that maps it with SIGBUS).
func TestCopyWeights(t *testing.T) {
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 96, Heads: 4, KVHeads: 2, Vocab: 100, DType: weights.BF16, Seed: 5}
	dir := testmodel.WriteTemp(t, spec)
	gen := func(o Options) []int {
		m, err := Load(dir, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if o.CopyWeights {
			if err := os.Truncate(filepath.Join(dir, weights.SingleFileName), 0); err != nil {
				t.Fatal(err)
			}
		}
		s, err := m.NewSession(0)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Generate(context.Background(), []int{5, 6, 7}, GenerateOptions{MaxTokens: 8, StopTokens: []int{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	mapped := gen(Options{Device: "cpu", ContextLength: 32})
	copied := gen(Options{Device: "cpu", ContextLength: 32, CopyWeights: true})
	if !slices.Equal(mapped, copied) {
		t.Errorf("copied weights generate %v, mapped %v", copied, mapped)
	}
}

// BenchmarkCopyWeights loads a 505 MB bf16 checkpoint (a two-layer Llama,
// hidden 2048, FFN 8192, vocabulary 32000; in the page cache once written)
// mapped and with CopyWeights on the CPU: Load alone, and Load followed by
// the first token of an 8-token prompt, where a mapping pays its page faults.
func BenchmarkCopyWeights(b *testing.B) {
	spec := testmodel.Llama{Layers: 2, Hidden: 2048, FFN: 8192, Heads: 32, KVHeads: 8, Vocab: 32000, DType: weights.BF16, Seed: 1}
	dir := testmodel.WriteTemp(b, spec)
	st, err := os.Stat(filepath.Join(dir, weights.SingleFileName))
	if err != nil {
		b.Fatal(err)
	}
	prompt := []int{1, 2, 3, 4, 5, 6, 7, 8}
	for _, copied := range []bool{false, true} {
		for _, first := range []bool{false, true} {
			name := map[bool]string{false: "mmap", true: "copy"}[copied] + map[bool]string{false: "/load", true: "/load+first-token"}[first]
			b.Run(name, func(b *testing.B) {
				b.SetBytes(st.Size())
				for b.Loop() {
					m, err := Load(dir, Options{Device: "cpu", ContextLength: 16, CopyWeights: copied})
					if err != nil {
						b.Fatal(err)
					}
					if first {
						s, err := m.NewSession(0)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 1, StopTokens: []int{}}, nil); err != nil {
							b.Fatal(err)
						}
					}
					m.Close()
				}
			})
		}
	}
}
