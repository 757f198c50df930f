package kernels

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/model"
)

// TestRealShapeOnGPU is model.TestRealShape on the GPU: the real-shape
// folders (model/testdata/gen_moe_fixtures.py --real-shape: two layers of
// DeepSeek-V3 in FP8 and of Qwen3-30B-A3B in bf16; gen_v4_released.py
// --real-shape: one or two layers of DeepSeek-V4-Flash in its released FP8 +
// MXFP4 layout), random weights at the released dimensions, each with
// transformers' float32 logits_full of its input_ids in golden.safetensors.
// MANIFOLD_REALSHAPE_DIR names the folder holding them (or one of them); the
// test is skipped without it or without a GPU.
//
// Each folder is run once on the GPU and once on the CPU backend (the
// reference kernels refCPU, as TestReleasedOnGPU), the whole input in one
// forward pass, and it reports, per model, max |dlogit| and top-1 agreement
// of GPU vs transformers, CPU vs transformers and GPU vs CPU, with the
// largest |logit| for scale and the time of each pass. It fails where
// max |GPU - CPU| exceeds MANIFOLD_REALSHAPE_GPU_TOL (default 2e-2, the
// fixtures' bound), where max |CPU - transformers| exceeds
// MANIFOLD_REALSHAPE_TOL (default 1e-2, model.TestRealShape's), or where a
// top-1 differs at a position whose reference top-1 leads its runner-up by
// more than twice the largest difference (a real disagreement, not a near
// tie). MANIFOLD_REALSHAPE_CPU=0 leaves the CPU pass out (GPU vs
// transformers only).
func TestRealShapeOnGPU(t *testing.T) {
	root := golden.RealShapeRoot(t, "model/testdata/gen_moe_fixtures.py --real-shape, gen_v4_released.py --real-shape write them")
	g := newGPU(t)
	tolCPU, tolGPU := golden.EnvFloat(t, "MANIFOLD_REALSHAPE_TOL", 1e-2), golden.EnvFloat(t, "MANIFOLD_REALSHAPE_GPU_TOL", 2e-2)
	withCPU := os.Getenv("MANIFOLD_REALSHAPE_CPU") != "0"
	golden.RealShapes(t, root, func(t *testing.T, dir string, ref *golden.Reference) {
		f, err := model.ReadFolder(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		forward := func(name string, be backend.Backend) ([]float32, error) {
			start := time.Now()
			m, err := model.Build(be, f, model.Options{})
			if err != nil {
				return nil, err
			}
			built := time.Since(start)
			start = time.Now()
			logits, err := golden.Forward(m, ref)
			if err != nil {
				return nil, err
			}
			c := m.Config()
			t.Logf("%s: %s, %d layers, hidden %d, vocab %d; built in %.1fs, forward of %d tokens in %.2fs", name,
				c.ModelType, c.NumLayers, c.HiddenSize, c.VocabSize, built.Seconds(), len(ref.InputIDs), time.Since(start).Seconds())
			return logits, nil
		}
		V := ref.Vocab
		t.Logf("%s: T %d, max |logit| of transformers %.3g", dir, len(ref.InputIDs), golden.MaxAbs(ref.LogitsFull))
		// A GPU failure is reported and the CPU pass still runs.
		gl, err := forward("GPU", g)
		if err != nil {
			t.Errorf("GPU: %v", err)
		} else {
			compareLogits(t, "GPU vs transformers", gl, ref.LogitsFull, V, tolCPU+tolGPU)
		}
		if !withCPU {
			return
		}
		cl, err := forward("CPU", refCPU())
		if err != nil {
			t.Fatalf("CPU: %v", err)
		}
		compareLogits(t, "CPU vs transformers", cl, ref.LogitsFull, V, tolCPU)
		if gl != nil {
			compareLogits(t, "GPU vs CPU", gl, cl, V, tolGPU)
		}
		if d := os.Getenv("MANIFOLD_REALSHAPE_DIAG"); d == "1" || d == "layers" {
			realShapeDiag(t, g, f, gl, cl, ref.Vocab, forward)
		}
	})
}

// realShapeDiag localizes a GPU-vs-CPU difference (MANIFOLD_REALSHAPE_DIAG=1,
// or =layers without the variants):
// GPU against CPU logits with the first L layers only (the folder's
// NumLayers cut to L), then with every layer under each conformance variant
// (the kernel families a variant forces elsewhere: a variant that agrees
// where the default does not names the kernel at fault). It only logs.
func realShapeDiag(t *testing.T, g *Backend, f *model.Folder, gpuLogits, cpuLogits []float32, V int,
	forward func(string, backend.Backend) ([]float32, error)) {
	diff := func(a, b []float32) float64 {
		d := 0.0
		for i := range a {
			d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		}
		return d
	}
	// Per position: a router's near tie that the GPU's rounding flips
	// changes one token's MoE output, so (in the last layer) one row.
	if gpuLogits != nil {
		rows := make([]string, 0, len(cpuLogits)/V)
		for i := 0; i < len(cpuLogits); i += V {
			rows = append(rows, fmt.Sprintf("%.2g", diff(gpuLogits[i:i+V], cpuLogits[i:i+V])))
		}
		t.Logf("DIAG GPU vs CPU max |dlogit| by position: %s", strings.Join(rows, " "))
	}
	layersAll := f.Config.NumLayers
	for L := 1; L < layersAll; L++ {
		f.Config.NumLayers = L
		gl, err := forward(fmt.Sprintf("GPU %d layers", L), g)
		if err == nil {
			var cl []float32
			if cl, err = forward(fmt.Sprintf("CPU %d layers", L), refCPU()); err == nil {
				t.Logf("DIAG layers=%d: GPU vs CPU max |dlogit| %.3g", L, diff(gl, cl))
			}
		}
		if err != nil {
			t.Logf("DIAG layers=%d: %v", L, err)
		}
	}
	f.Config.NumLayers = layersAll
	if os.Getenv("MANIFOLD_REALSHAPE_DIAG") == "layers" {
		return
	}
	defer func() { g.force = variants{} }()
	for _, v := range conformanceVariants[1:] {
		g.force = v.force
		gl, err := forward("GPU "+v.name, g)
		if err != nil {
			t.Logf("DIAG variant %s: %v", v.name, err)
			continue
		}
		t.Logf("DIAG variant %s: GPU vs CPU max |dlogit| %.3g", v.name, diff(gl, cpuLogits))
	}
}

// compareLogits logs max |got - want| and the top-1 agreement over the rows
// of V logits, and fails where the difference exceeds tol or a top-1
// differs at a position whose want top-1 leads its runner-up by more than
// twice that row's difference (not a near tie).
func compareLogits(t *testing.T, what string, got, want []float32, V int, tol float64) {
	t.Helper()
	c := golden.CompareLogits(got, want, V)
	t.Logf("%s: max |dlogit| %.3g, top-1 agreement %d/%d (%d more differ within a near tie)", what, c.Worst, c.Agree, c.Rows, c.Ties)
	if c.Worst > tol || math.IsNaN(c.Worst) {
		t.Errorf("%s: max |dlogit| %.3g > %g", what, c.Worst, tol)
	}
	if c.Agree+c.Ties != c.Rows {
		t.Errorf("%s: top-1 differs at %d of %d positions beyond a near tie", what, c.Rows-c.Agree-c.Ties, c.Rows)
	}
}
