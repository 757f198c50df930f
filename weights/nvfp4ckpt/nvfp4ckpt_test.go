package nvfp4ckpt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testnum"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

func f32Bytes(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

type tensor struct {
	name  string
	dtype weights.DType
	shape []int
	data  []byte
}

// writeCheckpoint writes tensors to dir/model.safetensors and opens it.
func writeCheckpoint(t *testing.T, ts []tensor) *weights.Checkpoint {
	t.Helper()
	dir := t.TempDir()
	w, err := weights.Create(filepath.Join(dir, "model.safetensors"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		if err := w.Add(x.name, x.dtype, x.shape, x.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := weights.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

const prefix = "model.layers.0.mlp.down_proj"

func quantized(t *testing.T, rows, cols int) *quant.NVFP4 {
	t.Helper()
	m, err := quant.QuantizeNVFP4(testnum.Normal(rand.New(rand.NewPCG(uint64(rows*cols), 1)), rows*cols, 0, 1), rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func modelOptTensors(m *quant.NVFP4, inputScale float32) []tensor {
	ts := []tensor{
		{prefix + ".weight", weights.U8, []int{m.Rows, m.Cols / 2}, m.Packed},
		{prefix + ".weight_scale", weights.F8E4M3, []int{m.Rows, m.Cols / 16}, m.Scales},
		{prefix + ".weight_scale_2", weights.F32, []int{}, f32Bytes(m.GlobalScale)},
	}
	if inputScale != 0 {
		ts = append(ts, tensor{prefix + ".input_scale", weights.F32, []int{}, f32Bytes(inputScale)})
	}
	return ts
}

func TestLoadModelOpt(t *testing.T) {
	m := quantized(t, 130, 80)
	c := writeCheckpoint(t, modelOptTensors(m, 0.25))
	if l := DetectLayout(c, prefix); l != LayoutModelOpt {
		t.Fatalf("DetectLayout = %v, want ModelOpt", l)
	}
	got, err := Load(c, prefix)
	if err != nil {
		t.Fatal(err)
	}
	if got.Rows != 130 || got.Cols != 80 || !bytes.Equal(got.Packed, m.Packed) || !bytes.Equal(got.Scales, m.Scales) ||
		got.GlobalScale != m.GlobalScale || got.InputScale != 0.25 {
		t.Errorf("loaded %dx%d gs %v is %v; want the written matrix", got.Rows, got.Cols, got.GlobalScale, got.InputScale)
	}
	// Clone survives Close.
	cl := got.Clone()
	c.Close()
	if !bytes.Equal(cl.Packed, m.Packed) {
		t.Error("Clone differs")
	}
}

func TestLoadModelOptFlatSwizzled(t *testing.T) {
	m := quantized(t, 130, 80)
	swz := m.SwizzledScales()
	ts := modelOptTensors(m, 0)
	ts[1] = tensor{prefix + ".weight_scale", weights.U8, []int{len(swz)}, swz}
	got, err := Load(writeCheckpoint(t, ts), prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Scales, m.Scales) {
		t.Error("flat swizzled scales were not unswizzled")
	}
}

func TestLoadLightX2V(t *testing.T) {
	m := quantized(t, 130, 80)
	swz := m.SwizzledScales()
	pr, pc := quant.SwizzledScaleShape(130, 5)
	wgs := 1 / m.GlobalScale     // LightX2V's weight global scale, 2688/amax
	igs := float32(2688.0 / 5.0) // input_global_scale for an activation amax of 5
	alpha := 1 / (igs * wgs)     // what the GEMM multiplies by
	base := []tensor{
		{prefix + ".weight", weights.U8, []int{130, 40}, m.Packed},
		{prefix + ".weight_scale", weights.F8E4M3, []int{pr, pc}, swz},
	}
	cases := []struct {
		name  string
		extra []tensor
	}{
		{"alpha and input_global_scale", []tensor{
			{prefix + ".input_global_scale", weights.F32, []int{1}, f32Bytes(igs)},
			{prefix + ".alpha", weights.F32, []int{}, f32Bytes(alpha)},
		}},
		{"weight_global_scale and input_absmax", []tensor{
			{prefix + ".weight_global_scale", weights.F32, []int{}, f32Bytes(wgs)},
			{prefix + ".input_absmax", weights.F32, []int{}, f32Bytes(5)},
		}},
	}
	want := m.Dequantize()
	for _, tc := range cases {
		c := writeCheckpoint(t, append(append([]tensor{}, base...), tc.extra...))
		if l := DetectLayout(c, prefix); l != LayoutLightX2V {
			t.Fatalf("%s: DetectLayout = %v, want LightX2V", tc.name, l)
		}
		got, err := Load(c, prefix)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(got.Scales, m.Scales) {
			t.Errorf("%s: scales differ after unswizzle", tc.name)
		}
		if math.Abs(float64(got.GlobalScale/m.GlobalScale)-1) > 1e-6 {
			t.Errorf("%s: GlobalScale %v, want %v", tc.name, got.GlobalScale, m.GlobalScale)
		}
		if math.Abs(float64(got.InputScale)-5.0/2688) > 1e-9 {
			t.Errorf("%s: InputScale %v, want 5/2688", tc.name, got.InputScale)
		}
		d := got.Dequantize()
		for i := range d {
			if math.Abs(float64(d[i]-want[i])) > 1e-6*math.Abs(float64(want[i])) {
				t.Fatalf("%s: element %d = %v, want %v", tc.name, i, d[i], want[i])
			}
		}
	}
}

func TestLoadErrors(t *testing.T) {
	m := quantized(t, 4, 32)
	mo := func(edit func([]tensor) []tensor) []tensor { return edit(modelOptTensors(m, 0)) }
	cases := []struct {
		name    string
		ts      []tensor
		want    error
		mention string
	}{
		{"unquantized weight", mo(func(ts []tensor) []tensor {
			ts[0] = tensor{prefix + ".weight", weights.BF16, []int{4, 32}, make([]byte, 4*32*2)}
			return ts
		}), ErrUnsupportedDType, prefix + ".weight"},
		{"K not divisible by 16", mo(func(ts []tensor) []tensor {
			ts[0] = tensor{prefix + ".weight", weights.U8, []int{4, 12}, make([]byte, 48)}
			return ts
		}), quant.ErrBlockAlign, "K = 24"},
		{"missing weight_scale", mo(func(ts []tensor) []tensor { return append(ts[:1], ts[2:]...) }),
			ErrMissingScale, prefix + ".weight_scale"},
		{"missing weight_scale_2", mo(func(ts []tensor) []tensor { return ts[:2] }),
			ErrMissingScale, prefix + ".weight_scale_2"},
		{"scale dtype", mo(func(ts []tensor) []tensor {
			ts[1] = tensor{prefix + ".weight_scale", weights.F32, []int{4, 2}, make([]byte, 32)}
			return ts
		}), ErrUnsupportedDType, "F8_E4M3"},
		{"scale shape", mo(func(ts []tensor) []tensor {
			ts[1] = tensor{prefix + ".weight_scale", weights.F8E4M3, []int{2, 4}, make([]byte, 8)}
			return ts
		}), ErrBadTensor, "[2 4]"},
		{"global scale not scalar", mo(func(ts []tensor) []tensor {
			ts[2] = tensor{prefix + ".weight_scale_2", weights.F32, []int{2}, f32Bytes(1, 2)}
			return ts
		}), ErrBadTensor, "scalar"},
		{"NaN global scale", mo(func(ts []tensor) []tensor {
			ts[2] = tensor{prefix + ".weight_scale_2", weights.F32, []int{}, f32Bytes(float32(math.NaN()))}
			return ts
		}), quant.ErrNonFinite, "weight_scale_2"},
		{"NaN block scale", mo(func(ts []tensor) []tensor {
			s := append([]byte(nil), m.Scales...)
			s[5] = 0x7f
			ts[1] = tensor{prefix + ".weight_scale", weights.F8E4M3, []int{4, 2}, s}
			return ts
		}), quant.ErrNonFinite, "row 2, block 1"},
		{"LightX2V without alpha or weight_global_scale", []tensor{
			{prefix + ".weight", weights.U8, []int{4, 16}, m.Packed},
			{prefix + ".weight_scale", weights.F8E4M3, []int{128, 4}, make([]byte, 512)},
			{prefix + ".input_global_scale", weights.F32, []int{}, f32Bytes(3)},
		}, ErrMissingScale, prefix + ".alpha"},
		{"LightX2V unpadded scales", []tensor{
			{prefix + ".weight", weights.U8, []int{4, 16}, m.Packed},
			{prefix + ".weight_scale", weights.F8E4M3, []int{4, 2}, m.Scales},
			{prefix + ".weight_global_scale", weights.F32, []int{}, f32Bytes(3)},
		}, ErrBadTensor, "padded"},
	}
	for _, tc := range cases {
		_, err := Load(writeCheckpoint(t, tc.ts), prefix)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.mention) || !strings.Contains(err.Error(), "model.safetensors") {
			t.Errorf("%s: error %q should name the file and %q", tc.name, err, tc.mention)
		}
	}
	c := writeCheckpoint(t, modelOptTensors(m, 0))
	if _, err := Load(c, "model.layers.9.mlp.up_proj"); !errors.Is(err, weights.ErrMissingTensor) {
		t.Errorf("absent module: err = %v, want weights.ErrMissingTensor", err)
	}
	if Has(c, "model.layers.9.mlp.up_proj") {
		t.Error("Has reports an absent module")
	}
}

func writeFile(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadConfig(t *testing.T) {
	t.Run("hf_quant_config.json", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "config.json", `{"model_type": "llama"}`)
		writeFile(t, dir, HFQuantConfigFile, `{"producer": {"name": "modelopt", "version": "0.29.0"},
			"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": null, "group_size": 16,
			"exclude_modules": ["lm_head", "model.layers.*.mlp.gate", "model.visual"]}}`)
		cfg, err := ReadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Algo != AlgoNVFP4 || cfg.GroupSize != 16 || cfg.Producer != "modelopt" || len(cfg.Exclude) != 3 {
			t.Fatalf("config = %+v", cfg)
		}
		for module, want := range map[string]bool{
			"model.layers.0.mlp.down_proj":        true,
			"model.layers.0.mlp.gate_proj.weight": true,
			"model.layers.3.mlp.gate":             false,
			"lm_head":                             false,
			"lm_head.weight":                      false,
			"model.visual.blocks.0.fc1":           false,
			"model.visualizer.fc1":                true,
		} {
			if got := cfg.IsQuantized(module); got != want {
				t.Errorf("IsQuantized(%q) = %v, want %v", module, got, want)
			}
		}
	})
	t.Run("config.json quantization_config", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "config.json", `{"model_type": "qwen3", "quantization_config": {"quant_method": "modelopt",
			"quant_algo": "NVFP4", "ignore": ["lm_head"], "config_groups": {"group_0": {"weights": {"group_size": 16,
			"num_bits": 4, "type": "float"}, "targets": ["Linear"]}}, "producer": {"name": "modelopt"}}}`)
		cfg, err := ReadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Algo != AlgoNVFP4 || cfg.GroupSize != 16 || cfg.IsQuantized("lm_head") || !cfg.IsQuantized("model.layers.0.self_attn.q_proj") {
			t.Errorf("config = %+v", cfg)
		}
	})
	t.Run("DeepSeek FP8 block", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "config.json", `{"quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
			"quant_method": "fp8", "weight_block_size": [128, 128]}}`)
		cfg, err := ReadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Algo != AlgoFP8Block || cfg.BlockSize != [2]int{128, 128} || cfg.IsQuantized("x") {
			t.Errorf("config = %+v", cfg)
		}
	})
	t.Run("unquantized", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "config.json", `{"model_type": "llama"}`)
		cfg, err := ReadConfig(dir)
		if err != nil || cfg != nil {
			t.Fatalf("ReadConfig = %+v, %v; want nil, nil", cfg, err)
		}
		if cfg.IsQuantized("model.layers.0.mlp.up_proj") {
			t.Error("nil config quantizes a module")
		}
		cfg, err = ReadConfig(t.TempDir()) // no config at all
		if err != nil || cfg != nil {
			t.Fatalf("empty dir: ReadConfig = %+v, %v; want nil, nil", cfg, err)
		}
	})
	bad := []struct {
		name, file, content string
		want                error
	}{
		{"unknown quant_algo", HFQuantConfigFile, `{"quantization": {"quant_algo": "INT8_SQ"}}`, ErrUnknownQuantAlgo},
		{"unknown quant_algo in config.json", "config.json", `{"quantization_config": {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}}`, ErrUnknownQuantAlgo},
		{"unknown quant_method", "config.json", `{"quantization_config": {"quant_method": "gptq", "bits": 4}}`, ErrUnknownQuantAlgo},
		{"group size 32", HFQuantConfigFile, `{"quantization": {"quant_algo": "NVFP4", "group_size": 32}}`, ErrBadConfig},
		{"no quantization object", HFQuantConfigFile, `{"producer": {}}`, ErrBadConfig},
		{"bad JSON", HFQuantConfigFile, `{"quantization": `, ErrBadConfig},
		{"bad exclude pattern", HFQuantConfigFile, `{"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["a["]}}`, ErrBadConfig},
		{"bad block size", "config.json", `{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}}`, ErrBadConfig},
	}
	for _, tc := range bad {
		dir := t.TempDir()
		writeFile(t, dir, tc.file, tc.content)
		_, err := ReadConfig(dir)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.file) {
			t.Errorf("%s: err = %v, want %v naming %s", tc.name, err, tc.want, tc.file)
		}
	}
}
