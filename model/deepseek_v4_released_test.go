package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/convert"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// tinyReleasedV4 has FP8 weights of several 128x128 tiles, partial edge
// tiles, an output-projection group split inside a tile, every layer kind
// and a hash-routed layer.
var tinyReleasedV4 = testmodel.DeepseekV4{
	Vocab: 300, Hidden: 160, Layers: 4, Heads: 3, HeadDim: 64, QLora: 144, OGroups: 2, OLora: 80, Window: 6,
	RateCSA: 2, RateHCA: 5, IndexHeads: 2, IndexDim: 32, IndexTopK: 3, HCMult: 4, HCIters: 5,
	Experts: 6, TopK: 2, MoEFFN: 96, RopeDim: 16, HashLayers: 1,
	LayerTypes: []string{testmodel.V4HCA, testmodel.V4CSA, testmodel.V4Sliding, testmodel.V4CSA}, Seed: 11,
}

func writeReleased(t *testing.T, format string) string {
	t.Helper()
	d := tinyReleasedV4
	d.Released = format
	dir := t.TempDir()
	if err := d.Write(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// transformersName is the name transformers' DeepSeek-V4 checkpoint (the
// layout this package read first) gives the released tensor n.
func transformersName(n string) string {
	switch n {
	case "embed.weight":
		return "model.embed_tokens.weight"
	case "norm.weight":
		return "model.norm.weight"
	case "head.weight":
		return n
	}
	if rest, ok := strings.CutPrefix(n, "hc_head_"); ok {
		return "model.hc_head.hc_" + rest
	}
	return "model." + strings.Replace(n, ".attn.kv_norm.", ".attn.norm.", 1)
}

// dequantizeReleased writes the released checkpoint src as transformers'
// float32 layout into a new folder: every FP8, MXFP4 and NVFP4 linear
// dequantized, the scales and the MTP block dropped, the quantization
// fields taken out of the config.
func dequantizeReleased(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"quantization_config", "expert_dtype", "moe_quant_algo"} {
		delete(cfg, k)
	}
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dst, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := weights.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w, err := weights.Create(filepath.Join(dst, "model.safetensors"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range ck.Names() {
		tn, _ := ck.Tensor(name)
		module, isWeight := strings.CutSuffix(name, ".weight")
		var m quant.RowDecoder
		switch {
		case strings.HasPrefix(name, "mtp."), strings.HasSuffix(name, ".scale"), strings.HasSuffix(name, ".weight_scale"),
			strings.HasSuffix(name, ".weight_scale_2"), strings.HasSuffix(name, ".input_scale"):
			continue
		case isWeight && tn.DType == weights.F8E4M3:
			m, err = nvfp4ckpt.LoadFP8Block(ck, module, nvfp4ckpt.DefaultFP8Block)
		case isWeight && nvfp4ckpt.IsMXFP4(ck, module):
			m, err = nvfp4ckpt.LoadMXFP4(ck, module)
		case isWeight && (tn.DType == weights.U8 || tn.DType == weights.I8):
			m, err = nvfp4ckpt.Load(ck, module)
		}
		if err != nil {
			t.Fatal(err)
		}
		dtype, shape, data := tn.DType, tn.Shape, tn.Data
		if m != nil {
			rows, cols := tn.Shape[0], tn.Shape[1]
			if tn.DType != weights.F8E4M3 {
				cols *= 2
			}
			dtype, shape, data = weights.F32, []int{rows, cols}, nil
			row := make([]float32, cols)
			for r := range rows {
				m.DequantizeRow(row, r)
				for _, v := range row {
					data = binary.LittleEndian.AppendUint32(data, math.Float32bits(v))
				}
			}
		}
		if err := w.Add(transformersName(name), dtype, shape, data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestV4ReleasedMatchesDequantized loads DeepSeek-V4 in each released
// format as it ships (FP8 + MXFP4; NVIDIA's NVFP4 experts; -Base's f32
// scales and FP8 experts) and holds its logits to those of the same weights
// dequantized into transformers' float32 layout.
func TestV4ReleasedMatchesDequantized(t *testing.T) {
	for _, format := range []string{testmodel.V4FP8MXFP4, testmodel.V4FP8NVFP4, testmodel.V4FP8Base} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			src := writeReleased(t, format)
			ref := loadTestModel(t, dequantizeReleased(t, src))
			m := loadTestModel(t, src)
			tokens := make([]int32, 19)
			for i := range tokens {
				tokens[i] = int32((i*97 + 3) % tinyReleasedV4.Vocab)
			}
			var logits [2][]float32
			for i, mm := range []Model{ref, m} {
				st, err := mm.NewState(len(tokens))
				if err != nil {
					t.Fatal(err)
				}
				if logits[i], err = mm.Forward(context.Background(), st, tokens, true); err != nil {
					t.Fatal(err)
				}
			}
			if d := maxAbsDiff(logits[1], logits[0]); d > 1e-5 || math.IsNaN(d) {
				t.Errorf("released vs dequantized: max |logit diff| %.3g", d)
			} else {
				t.Logf("released vs dequantized: max |logit diff| %.3g (logit range ±%.3g)", d, maxAbsDiff(logits[0], make([]float32, len(logits[0]))))
			}
		})
	}
}

// TestV4ReleasedErrors damages a released checkpoint one way at a time; each
// load fails with an error that names the tensor (or field) and classifies.
func TestV4ReleasedErrors(t *testing.T) {
	src := writeReleased(t, testmodel.V4FP8MXFP4)
	const scale = "layers.1.attn.wq_b.scale"
	const expert = "layers.2.ffn.experts.3.w2"
	for _, c := range []struct {
		name   string
		edit   func(t *weights.Tensor) *weights.Tensor
		field  string // set in config.json to value
		value  any
		want   error
		naming string
	}{
		{name: "FP8 scale shape", edit: func(t *weights.Tensor) *weights.Tensor {
			if t.Name == scale {
				t.Shape = []int{t.Shape[0] * t.Shape[1], 1}
			}
			return t
		}, want: nvfp4ckpt.ErrBadTensor, naming: scale},
		{name: "FP8 scale dtype", edit: func(t *weights.Tensor) *weights.Tensor {
			if t.Name == scale {
				t.DType = weights.U8
			}
			return t
		}, want: nvfp4ckpt.ErrUnsupportedDType, naming: scale},
		{name: "FP8 scale missing", edit: func(t *weights.Tensor) *weights.Tensor {
			if t.Name == scale {
				t.Name = "unused.scale"
			}
			return t
		}, want: nvfp4ckpt.ErrMissingScale, naming: scale},
		{name: "MXFP4 scale transposed", edit: func(t *weights.Tensor) *weights.Tensor {
			if t.Name == expert+".scale" {
				t.Shape = []int{t.Shape[1], t.Shape[0]}
			}
			return t
		}, want: nvfp4ckpt.ErrBadTensor, naming: expert + ".scale"},
		{name: "MXFP4 scale dtype", edit: func(t *weights.Tensor) *weights.Tensor {
			if t.Name == expert+".scale" {
				t.DType = weights.F8E4M3
			}
			return t
		}, want: nvfp4ckpt.ErrUnsupportedDType, naming: expert + ".scale"},
		{name: "expert missing", edit: func(t *weights.Tensor) *weights.Tensor {
			if strings.HasPrefix(t.Name, expert+".") {
				t.Name = "unused." + t.Name
			}
			return t
		}, want: weights.ErrMissingTensor, naming: expert + ".weight"},
		{name: "expert_dtype fp8 over MXFP4", field: "expert_dtype", value: "fp8",
			want: ErrConfig, naming: "layers.0.ffn.experts.0.w1.weight"},
		{name: "moe_quant_algo NVFP4 over MXFP4", field: "moe_quant_algo", value: "NVFP4",
			want: ErrConfig, naming: "moe_quant_algo"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			edit := c.edit
			if edit == nil {
				edit = func(t *weights.Tensor) *weights.Tensor { return t }
			}
			if err := testmodel.Rewrite(src, dst, edit); err != nil {
				t.Fatal(err)
			}
			if c.field != "" {
				editConfig(t, dst, c.field, c.value)
			}
			err := openErr(dst)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.naming) {
				t.Errorf("load: %v\nwant %v naming %q", err, c.want, c.naming)
			}
		})
	}
}

// TestV4ReleasedMissingShard splits a released checkpoint into shards and
// removes one: the open names the shard.
func TestV4ReleasedMissingShard(t *testing.T) {
	src := writeReleased(t, testmodel.V4FP8MXFP4)
	dst := t.TempDir()
	ck, err := weights.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w := weights.NewShardedWriter(dst, 1<<20, nil)
	for _, name := range ck.Names() {
		tn, _ := ck.Tensor(name)
		if err := w.Add(name, tn.DType, tn.Shape, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(src, "config.json"))
	if err := os.WriteFile(filepath.Join(dst, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := openErr(dst); err != nil {
		t.Fatalf("sharded copy: %v", err)
	}
	shards, _ := filepath.Glob(filepath.Join(dst, "model-*-of-*.safetensors"))
	if len(shards) < 2 {
		t.Fatalf("%d shards, want several", len(shards))
	}
	os.Remove(shards[1])
	if err := openErr(dst); !errors.Is(err, weights.ErrMissingShard) || !strings.Contains(err.Error(), filepath.Base(shards[1])) {
		t.Errorf("open with a shard missing: %v, want ErrMissingShard naming %s", err, filepath.Base(shards[1]))
	}
}

func openErr(dir string) error {
	f, _, err := Open(dir, cpu.New(0), Options{})
	if err == nil {
		f.Close()
	}
	return err
}

// TestV4ReleasedGolden runs the released-layout fixtures that
// testdata/gen_v4_released.py makes with transformers 5.17 (one folder per
// format, every size read from the files): full-sequence logits within
// 1e-3 of transformers' float32 compute on the dequantized weights, and
// greedy tokens equal.
func TestV4ReleasedGolden(t *testing.T) {
	root := filepath.Join("testdata", "deepseek_v4_released")
	found := false
	for _, format := range []string{testmodel.V4FP8MXFP4, testmodel.V4FP8NVFP4, testmodel.V4FP8Base} {
		dir := filepath.Join(root, format)
		if _, err := os.Stat(filepath.Join(dir, "golden.safetensors")); err != nil {
			continue
		}
		found = true
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			testGoldenModel(t, dir)
		})
	}
	if !found {
		t.Skipf("no fixture in %s: make it on the device machine with "+
			"`python3 model/testdata/gen_v4_released.py --out $OUT/deepseek_v4_released` (transformers 5.17) and copy the folder there", root)
	}
}

// TestV4ReleasedConverted converts a released checkpoint (FP8 + MXFP4) to
// NVFP4 and loads the result: DeepSeek's names and legacy config carry
// over, and its logits point the released model's way (the FP8 linears
// are requantized; the experts are exact).
func TestV4ReleasedConverted(t *testing.T) {
	src := writeReleased(t, testmodel.V4FP8MXFP4)
	out := filepath.Join(t.TempDir(), "nvfp4")
	if _, err := convert.Convert(context.Background(), convert.Options{In: src, Out: out, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	tokens := []int32{5, 77, 120, 3, 250, 9, 64}
	var logits [2][]float32
	for i, dir := range []string{src, out} {
		m := loadTestModel(t, dir)
		st, err := m.NewState(len(tokens))
		if err != nil {
			t.Fatal(err)
		}
		if logits[i], err = m.Forward(context.Background(), st, tokens, false); err != nil {
			t.Fatal(err)
		}
	}
	// Random tiny weights compound NVFP4's ~10% per-tensor error through
	// the layers: hold the logits to the same direction, not to a tolerance.
	var ab, aa, bb float64
	for i, a := range logits[0] {
		b := float64(logits[1][i])
		ab, aa, bb = ab+float64(a)*b, aa+float64(a)*float64(a), bb+b*b
	}
	if cos := ab / math.Sqrt(aa*bb); !(cos > 0.8) {
		t.Errorf("converted vs released last-token logits: cosine %.3f", cos)
	} else {
		t.Logf("converted vs released last-token logits: cosine %.3f", cos)
	}
}
