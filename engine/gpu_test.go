package engine

import (
	"context"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testimage"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/layers/dsa/htree"
	"github.com/manifoldlm/manifold/model"
)

// MANIFOLD_KERNEL_IMAGE: a kernel image built after this test binary
// (kernels/gpu.sh run).
func init() { testimage.FromEnv() }

// skipWithoutGPU skips the test or benchmark where there is no CUDA driver
// or GPU.
func skipWithoutGPU(tb testing.TB) {
	tb.Helper()
	if !kernels.Available() {
		tb.Skip("no CUDA driver or GPU")
	}
}

// testDevices are the devices a test runs on: the CPU, and the GPU where
// there is one.
func testDevices() []string {
	if kernels.Available() {
		return []string{"cpu", "cuda"}
	}
	return []string{"cpu"}
}

// TestDeviceSamplingMatchesHost generates on the GPU, where greedy and top-k
// sampling run on the device (the model's ForwardDevice leaves the logits
// there), and on the CPU, where the engine samples on the host: the same seed
// gives the same tokens. DeepSeek-V4: greedy over 8 tokens only, since its
// GPU kernels (mHC, sparse attention, routing) sum in other orders than the
// CPU and a draw or a pick near a boundary could differ.
func TestDeviceSamplingMatchesHost(t *testing.T) {
	skipWithoutGPU(t)
	for _, tc := range []struct {
		arch   string
		tokens int
		opts   []SamplingOptions
	}{
		{"llama", 24, []SamplingOptions{{}, {Temperature: 0.8, TopK: 40, Seed: 7}, {Temperature: 1.5, TopK: 5, Seed: 9}}},
		{"deepseek_v4", 8, []SamplingOptions{{}}},
	} {
		dir := golden.Path(t, tc.arch)
		ref := golden.Load(t, dir)
		for _, o := range tc.opts {
			var runs [][]int
			for _, device := range []string{"cuda", "cpu"} {
				m, err := Load(dir, Options{Device: device})
				if err != nil {
					t.Fatal(err)
				}
				s, _ := m.NewSession(0)
				n := min(20, len(ref.InputIDs))
				res, err := s.Generate(context.Background(), ints(ref.InputIDs[:n]), GenerateOptions{MaxTokens: tc.tokens, StopTokens: []int{}, Sampling: o}, nil)
				m.Close()
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, res.Tokens)
			}
			if !slices.Equal(runs[0], runs[1]) {
				t.Errorf("%s %+v:\nGPU %v\nCPU %v", tc.arch, o, runs[0], runs[1])
			}
		}
	}
}

// TestPipelinedGenerateV4 runs checkPipelined and checkRewound on a
// DeepSeek-V4 model whose routed experts are NVFP4, so that they run on the
// GPU and a held token's step is queued with no id on the host (its
// embedding and the first layer's hashed picks gathered by the held id;
// the golden V4 model's float32 experts route on the host, where the id is
// read back first).
func TestPipelinedGenerateV4(t *testing.T) {
	skipWithoutGPU(t)
	dir := t.TempDir()
	spec := testmodel.DeepseekV4{Vocab: 512, Hidden: 512, Layers: 5, Heads: 8, HeadDim: 512, QLora: 256, OGroups: 8,
		OLora: 128, IndexHeads: 8, IndexDim: 128, Experts: 8, MoEFFN: 256, HashLayers: 1, Seed: 3}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	m, err := Load(dir, Options{Device: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompt := benchPrompt(12, spec.Vocab)
	checkPipelinedPrompt(t, m, "deepseek_v4 nvfp4", prompt)
	checkRewound(t, m, prompt)
}

// TestPipelinedGenerate runs checkPipelined on the GPU, where the picks
// stay on the device (kernels.Backend.SampleTokenTo), with dense and htree
// attention.
func TestPipelinedGenerate(t *testing.T) {
	skipWithoutGPU(t)
	for _, arch := range []string{"llama", "qwen3"} {
		for _, att := range []model.AttentionOptions{{}, {Kind: "htree", HTree: htree.Options{Rate: 2, TopK: 1, TopCandidates: 2}}} {
			m, err := Load(golden.Path(t, arch), Options{Device: "cuda", Attention: att})
			if err != nil {
				t.Fatal(err)
			}
			checkPipelined(t, m, arch)
			m.Close()
		}
	}
}
