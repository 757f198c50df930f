package weights

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/quant"
)

// goldenDir returns $MANIFOLD_GOLDEN_DIR or ../shared/golden relative to the
// module root, skipping the test when it does not exist.
func goldenDir(t testing.TB) string {
	t.Helper()
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Skip("module root not found")
		}
		root = parent
	}
	dir := os.Getenv("MANIFOLD_GOLDEN_DIR")
	switch {
	case dir == "":
		dir = filepath.Join(root, "..", "shared", "golden")
	case !filepath.IsAbs(dir): // relative to the module root, as internal/golden reads it
		dir = filepath.Join(root, dir)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("golden fixtures not found at %s: SKIPPED, nothing checked (set MANIFOLD_GOLDEN_DIR)", dir)
	}
	return dir
}

func TestGoldenCheckpoints(t *testing.T) {
	dir := goldenDir(t)
	for _, arch := range []string{"llama", "qwen3", "deepseek_v32", "deepseek_v4"} {
		for _, sub := range []string{"", "bf16"} {
			d := filepath.Join(dir, arch, sub)
			if _, err := os.Stat(filepath.Join(d, "model.safetensors")); err != nil {
				continue
			}
			t.Run(filepath.Join(arch, sub), func(t *testing.T) {
				c, err := Open(d)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if len(c.Names()) == 0 {
					t.Fatal("no tensors")
				}
				for _, name := range c.Names() {
					tn, err := c.Tensor(name)
					if err != nil {
						t.Fatal(err)
					}
					if tn.NumElements()*tn.DType.Size() != len(tn.Data) {
						t.Fatalf("%s: %d elements of %s but %d bytes", name, tn.NumElements(), tn.DType, len(tn.Data))
					}
					switch tn.DType {
					case F32, BF16, F16, F8E4M3:
						v, err := tn.Float32()
						if err != nil {
							t.Fatal(err)
						}
						for i, x := range v {
							if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
								t.Fatalf("%s[%d] = %v", name, i, x)
							}
						}
					default:
						if _, err := tn.Int64s(); err != nil {
							t.Fatal(err)
						}
					}
				}
				g, err := Open(filepath.Join(d, "golden.safetensors"))
				if err != nil {
					t.Fatal(err)
				}
				defer g.Close()
				ids, err := g.Tensor("input_ids")
				if err != nil {
					t.Fatal(err)
				}
				if ids.DType != I64 || len(ids.Shape) != 1 {
					t.Fatalf("input_ids: %s %v, want I64 [T]", ids.DType, ids.Shape)
				}
				idv, err := ids.Int64s()
				if err != nil || len(idv) != ids.Shape[0] {
					t.Fatalf("input_ids: %d values, err %v", len(idv), err)
				}
				lf, err := g.Tensor("logits_full")
				if err != nil {
					t.Fatal(err)
				}
				if len(lf.Shape) != 2 || lf.Shape[0] != ids.Shape[0] {
					t.Fatalf("logits_full shape %v, input_ids %v", lf.Shape, ids.Shape)
				}
				if _, err := lf.Float32(); err != nil {
					t.Fatal(err)
				}
				if _, err := lf.Int64s(); err == nil {
					t.Fatal("Int64s of F32 logits succeeded")
				}
			})
		}
	}
}

// TestGoldenBF16Rounding checks that each bf16/ checkpoint holds exactly the
// round-to-nearest-even bf16 of its float32 twin, as quant.Float32ToBF16
// computes it.
func TestGoldenBF16Rounding(t *testing.T) {
	dir := goldenDir(t)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range entries {
		f32Dir, bf16Dir := filepath.Join(dir, e.Name()), filepath.Join(dir, e.Name(), "bf16")
		if _, err := os.Stat(filepath.Join(bf16Dir, "model.safetensors")); err != nil {
			continue
		}
		full, err := Open(f32Dir)
		if err != nil {
			t.Fatal(err)
		}
		half, err := Open(bf16Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range half.Names() {
			h, _ := half.Tensor(name)
			if h.DType != BF16 || !full.Has(name) {
				continue
			}
			f, _ := full.Tensor(name)
			fv, err := f.Float32()
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range fv {
				got := uint16(h.Data[2*i]) | uint16(h.Data[2*i+1])<<8
				if want := quant.Float32ToBF16(v); got != want {
					t.Fatalf("%s/%s[%d]: stored bf16 %#04x, Float32ToBF16(%v) = %#04x", e.Name(), name, i, got, v, want)
				}
			}
			checked++
		}
		full.Close()
		half.Close()
	}
	if checked == 0 {
		t.Skip("no bf16 tensors with float32 twins found")
	}
}
