package convert

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// loadsInEngine reports whether engine.Load accepts dir on the CPU.
func loadsInEngine(dir string) error {
	m, err := engine.Load(dir, engine.Options{Device: "cpu", Threads: 1})
	if err == nil {
		m.Close()
	}
	return err
}

// TestConvertedBadInputEngine damages a converted checkpoint in the ways
// issue 8 names and checks that engine.Load (through model.Build) rejects it
// with a named error (errors.Is) that mentions the tensor or field at fault.
func TestConvertedBadInputEngine(t *testing.T) {
	l := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 160, Heads: 4, KVHeads: 2, Vocab: 96, DType: weights.F32, Seed: 3}
	src := testmodel.WriteTemp(t, l)
	good := filepath.Join(t.TempDir(), "nvfp4")
	if _, err := convert(t, Options{In: src, Out: good}); err != nil {
		t.Fatal(err)
	}
	if err := loadsInEngine(good); err != nil {
		t.Fatalf("the undamaged conversion does not load: %v", err)
	}
	const module = "model.layers.0.mlp.down_proj"
	keep := func(tn *weights.Tensor) []*weights.Tensor { return []*weights.Tensor{tn} }
	// damage edits the tensors of module (name = module + suffix).
	damage := func(f func(suffix string, tn *weights.Tensor) []*weights.Tensor) func(*weights.Tensor) []*weights.Tensor {
		return func(tn *weights.Tensor) []*weights.Tensor {
			if suffix, ok := strings.CutPrefix(tn.Name, module); ok && strings.HasPrefix(suffix, ".") {
				return f(suffix, tn)
			}
			return keep(tn)
		}
	}
	cases := []struct {
		name    string
		edit    func(*weights.Tensor) []*weights.Tensor
		editCfg func(map[string]any)
		want    error
		mention string
	}{
		{"unsupported dtype (F32 block scales)", damage(func(suffix string, tn *weights.Tensor) []*weights.Tensor {
			if suffix != nvfp4ckpt.SuffixWeightScale {
				return keep(tn)
			}
			return []*weights.Tensor{{Name: tn.Name, DType: weights.F32, Shape: tn.Shape, Data: make([]byte, 4*tn.NumElements())}}
		}), nil, nvfp4ckpt.ErrUnsupportedDType, module + nvfp4ckpt.SuffixWeightScale},
		{"K not divisible by 16", damage(func(suffix string, tn *weights.Tensor) []*weights.Tensor {
			switch suffix {
			case nvfp4ckpt.SuffixWeight: // K = 24
				n := tn.Shape[0]
				return []*weights.Tensor{{Name: tn.Name, DType: weights.U8, Shape: []int{n, 12}, Data: make([]byte, n*12)}}
			case nvfp4ckpt.SuffixWeightScale:
				n := tn.Shape[0]
				return []*weights.Tensor{{Name: tn.Name, DType: weights.F8E4M3, Shape: []int{n, 1}, Data: make([]byte, n)}}
			}
			return keep(tn)
		}), nil, quant.ErrBlockAlign, module + nvfp4ckpt.SuffixWeight},
		{"missing weight_scale_2", damage(func(suffix string, tn *weights.Tensor) []*weights.Tensor {
			if suffix == nvfp4ckpt.SuffixWeightScale2 {
				return nil
			}
			return keep(tn)
		}), nil, nvfp4ckpt.ErrMissingScale, module + nvfp4ckpt.SuffixWeightScale2},
		{"missing weight_scale", damage(func(suffix string, tn *weights.Tensor) []*weights.Tensor {
			if suffix == nvfp4ckpt.SuffixWeightScale {
				return nil
			}
			return keep(tn)
		}), nil, nvfp4ckpt.ErrMissingScale, module + nvfp4ckpt.SuffixWeightScale},
		{"dense weight of unsupported dtype", damage(func(suffix string, tn *weights.Tensor) []*weights.Tensor {
			if suffix == nvfp4ckpt.SuffixWeight {
				return []*weights.Tensor{{Name: tn.Name, DType: weights.F8E5M2, Shape: []int{tn.Shape[0], 2 * tn.Shape[1]}, Data: make([]byte, 2*tn.NumElements())}}
			}
			if suffix == nvfp4ckpt.SuffixWeightScale || suffix == nvfp4ckpt.SuffixWeightScale2 {
				return nil
			}
			return keep(tn)
		}), func(cfg map[string]any) { delete(cfg, "quantization_config") }, nvfp4ckpt.ErrUnsupportedDType, module + nvfp4ckpt.SuffixWeight},
		{"unknown quant_algo", keep, func(cfg map[string]any) {
			cfg["quantization_config"].(map[string]any)["quant_algo"] = "MXFP9"
		}, nvfp4ckpt.ErrUnknownQuantAlgo, "MXFP9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := rewrite(t, good, tc.edit, tc.editCfg)
			err := loadsInEngine(dir)
			if !errors.Is(err, tc.want) {
				t.Fatalf("engine.Load: err = %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not name %q", err, tc.mention)
			}
		})
	}
	// The damaged copies are rewrites; the undamaged conversion is intact.
	if _, err := os.Stat(filepath.Join(good, nvfp4ckpt.HFQuantConfigFile)); err != nil {
		t.Error(err)
	}
}
