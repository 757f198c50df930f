package model

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/layers"
)

const goldenTol = 1e-3 // the fixtures' README: max |logit - golden| on the float32 CPU path

// TestGolden runs every fixture model whose architecture this package
// supports, in f32, bf16 and (DeepSeek-V3's released layout) fp8:
// full-sequence logits, incremental logits through the KV cache, and greedy
// generation, against HuggingFace transformers. The fixture set
// (../shared/golden) and the repository's own fixtures of the same layout
// (testdata/golden, written by testdata/gen_moe_fixtures.py) are both run.
func TestGolden(t *testing.T) {
	t.Run("fixtures", func(t *testing.T) { testGoldenRoot(t, golden.Dir(t), golden.Models(t)) })
	t.Run("testdata", func(t *testing.T) {
		root := filepath.Join("testdata", "golden")
		entries, _ := os.ReadDir(root)
		var archs []string
		for _, e := range entries {
			if e.IsDir() {
				archs = append(archs, e.Name())
			}
		}
		if len(archs) == 0 {
			t.Skipf("no fixtures in %s (python3 model/testdata/gen_moe_fixtures.py --out %s, on a machine with transformers 5.17)", root, root)
		}
		testGoldenRoot(t, root, archs)
	})
}

func testGoldenRoot(t *testing.T, root string, archs []string) {
	for _, arch := range archs {
		for _, variant := range []string{"", "bf16", "fp8"} {
			dir := filepath.Join(root, arch, variant)
			if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
				continue
			}
			if !slices.Contains(Supported(), modelType(t, dir)) {
				t.Logf("%s: architecture %q not supported yet, skipped", dir, modelType(t, dir))
				continue
			}
			t.Run(filepath.Join(arch, variant+"."), func(t *testing.T) {
				t.Parallel()
				testGoldenModel(t, dir)
			})
		}
	}
}

func modelType(t *testing.T, dir string) string {
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		ModelType string `json:"model_type"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return c.ModelType
}

// loadTestModel opens dir on the CPU with its float32 reference kernels
// (NVFP4 without the default kernels' int8 activations), the path the
// fixtures' 1e-3 bound is for.
func loadTestModel(t testing.TB, dir string) Model {
	t.Helper()
	f, m, err := Open(dir, cpu.NewWithOptions(cpu.Options{ReferenceNVFP4: true}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return m
}

func maxAbsDiff(a, b []float32) float64 { return testnum.MaxAbsDiff(a, b) }

func argmax(x []float32) int32 { return int32(layers.Argmax(x)) }

func testGoldenModel(t *testing.T, dir string) {
	ref := golden.Load(t, dir)
	m := loadTestModel(t, dir)
	ctx := context.Background()
	T, V := len(ref.InputIDs), ref.Vocab
	if V != m.Config().VocabSize {
		t.Fatalf("golden vocab %d, config %d", V, m.Config().VocabSize)
	}

	st, err := m.NewState(T)
	if err != nil {
		t.Fatal(err)
	}
	full, err := m.Forward(ctx, st, ref.InputIDs, true)
	if err != nil {
		t.Fatal(err)
	}
	if d := maxAbsDiff(full, ref.LogitsFull); d > goldenTol {
		t.Errorf("logits_full: max |diff| %.3g > %g", d, goldenTol)
	} else {
		t.Logf("logits_full: max |diff| %.3g", d)
	}

	if ref.LogitsIncremental != nil {
		P := T - ref.IncrementalRows + 1
		st, _ := m.NewState(T)
		got := make([]float32, 0, ref.IncrementalRows*V)
		last, err := m.Forward(ctx, st, ref.InputIDs[:P], false)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, last...)
		for p := P; p < T; p++ {
			if last, err = m.Forward(ctx, st, ref.InputIDs[p:p+1], false); err != nil {
				t.Fatal(err)
			}
			got = append(got, last...)
		}
		if d := maxAbsDiff(got, ref.LogitsIncremental); d > goldenTol {
			t.Errorf("logits_incremental: max |diff| %.3g > %g", d, goldenTol)
		} else {
			t.Logf("logits_incremental (P=%d): max |diff| %.3g", P, d)
		}
	}

	if ref.GreedyTokens != nil {
		const promptLen = 20 // the fixtures' README: greedy from input_ids[:20]
		n := len(ref.GreedyTokens)
		st, _ := m.NewState(promptLen + n)
		logits, err := m.Forward(ctx, st, ref.InputIDs[:promptLen], false)
		if err != nil {
			t.Fatal(err)
		}
		var got []int32
		for len(got) < n {
			tok := argmax(logits)
			got = append(got, tok)
			if len(got) == n {
				break
			}
			if logits, err = m.Forward(ctx, st, []int32{tok}, false); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, ref.GreedyTokens) {
			t.Errorf("greedy tokens:\n got %v\nwant %v", got, ref.GreedyTokens)
		}
	}
}
