package engine

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/kernels"
)

// TestDeviceSamplingMatchesHost generates on the GPU, where greedy and top-k
// sampling run on the device, and on the CPU, where the engine samples on the
// host: the same seed gives the same tokens.
func TestDeviceSamplingMatchesHost(t *testing.T) {
	if !kernels.Available() {
		t.Skip("no CUDA driver or GPU")
	}
	dir := filepath.Join(golden.Dir(t), "llama")
	ref := golden.Load(t, dir)
	for _, o := range []SamplingOptions{{}, {Temperature: 0.8, TopK: 40, Seed: 7}, {Temperature: 1.5, TopK: 5, Seed: 9}} {
		var runs [][]int
		for _, device := range []string{"cuda", "cpu"} {
			m, err := Load(dir, Options{Device: device})
			if err != nil {
				t.Fatal(err)
			}
			s, _ := m.NewSession(0)
			res, err := s.Generate(context.Background(), ints(ref.InputIDs[:20]), GenerateOptions{MaxTokens: 24, StopTokens: []int{}, Sampling: o}, nil)
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
			runs = append(runs, res.Tokens)
		}
		if !slices.Equal(runs[0], runs[1]) {
			t.Errorf("%+v:\nGPU %v\nCPU %v", o, runs[0], runs[1])
		}
	}
}
