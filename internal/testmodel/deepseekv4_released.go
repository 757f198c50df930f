package testmodel

import (
	"encoding/binary"
	"math"
	"strings"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// The formats DeepSeek-V4 ships in (DeepseekV4.Released), each in DeepSeek's
// own layout: original names without the "model." prefix (embed.weight,
// norm.weight, hc_head_fn, layers.N.attn.kv_norm.weight, ...), an MTP block
// mtp.0.* the engine does not read, FP8 E4M3 attention projections, indexer
// wq_b and shared expert with one scale per 128x128 tile in "<module>.scale",
// bf16 compressor and indexer weights_proj projections, and a config.json
// with the legacy fields the released one has (compress_ratios,
// num_hash_layers, qk_rope_head_dim, quantization_config fp8).
const (
	// V4FP8MXFP4 is deepseek-ai/DeepSeek-V4-Flash and -Pro: E8M0 tile scales,
	// routed experts in MXFP4 (I8 codes, an F8_E8M0 scale per 32 inputs),
	// expert_dtype fp4.
	V4FP8MXFP4 = "fp8-mxfp4"
	// V4FP8NVFP4 is nvidia/DeepSeek-V4-Flash-NVFP4: as V4FP8MXFP4 but the
	// routed experts in ModelOpt NVFP4 (U8 codes, F8_E4M3 weight_scale per
	// 16, F32 weight_scale_2 and input_scale), moe_quant_algo NVFP4.
	V4FP8NVFP4 = "fp8-nvfp4"
	// V4FP8Base is the -Base checkpoints: float32 power-of-two tile scales
	// and FP8 routed experts, expert_dtype fp8.
	V4FP8Base = "fp8-base"
)

type denseFunc func(name string, dtype weights.DType, mean, std float64, count v4Count, shape ...int)
type linFunc func(module string, count v4Count, rows, cols int)

// releasedLinear returns the linear writer of format d.Released: routed
// experts (count countExpert) in the format's expert encoding, the
// compressors' and the indexer's weights_proj in bf16, the rest FP8.
func (d DeepseekV4) releasedLinear(g v4Gen, out *[]v4Tensor, nvfp4 linFunc, dense denseFunc) linFunc {
	sd := quant.ScaleE8M0
	if d.Released == V4FP8Base {
		sd = quant.ScaleF32
	}
	fp8 := func(module string, count v4Count, rows, cols int) {
		name := module + ".weight"
		sr, sc := (rows+127)/128, (cols+127)/128
		*out = append(*out,
			v4Tensor{name: name, dtype: weights.F8E4M3, shape: []int{rows, cols}, count: count,
				make: func() []byte { return g.fp8(name, rows*cols) }},
			v4Tensor{name: module + ".scale", dtype: scaleDType(sd), shape: []int{sr, sc}, count: count,
				make: func() []byte { return g.pow2Scales(module+".scale", sr*sc, fp8Std(cols), sd) }})
	}
	mxfp4 := func(module string, count v4Count, rows, cols int) {
		name := module + ".weight"
		*out = append(*out,
			v4Tensor{name: name, dtype: weights.I8, shape: []int{rows, cols / 2}, count: count,
				make: func() []byte { return g.bytes(name, rows*cols/2) }},
			v4Tensor{name: module + ".scale", dtype: weights.F8E8M0, shape: []int{rows, cols / quant.MXFP4BlockSize}, count: count,
				make: func() []byte { // codes up to 6: rows of norm about 1
					return g.pow2Scales(module+".scale", rows*cols/quant.MXFP4BlockSize, 1/(3*math.Sqrt(float64(cols))), quant.ScaleE8M0)
				}})
	}
	return func(module string, count v4Count, rows, cols int) {
		switch {
		case strings.Contains(module, "compressor.") || strings.HasSuffix(module, "weights_proj"):
			dense(module+".weight", weights.BF16, 0, 1/math.Sqrt(float64(cols)), count, rows, cols)
		case count != countExpert || d.Released == V4FP8Base:
			fp8(module, count, rows, cols)
		case d.Released == V4FP8NVFP4:
			nvfp4(module, count, rows, cols)
			*out = append(*out, v4Tensor{name: module + ".input_scale", dtype: weights.F32, shape: []int{}, count: count,
				make: func() []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(1.0/448)) }})
		default:
			mxfp4(module, count, rows, cols)
		}
	}
}

func scaleDType(sd quant.ScaleDType) weights.DType {
	if sd == quant.ScaleF32 {
		return weights.F32
	}
	return weights.F8E8M0
}

// fp8Std is the power-of-two tile scale that gives rows of K values of
// norm about 1 from fp8's codes (about N(0, 16²)).
func fp8Std(k int) float64 { return 1 / (16 * math.Sqrt(float64(k))) }

// fp8 is n E4M3 codes of values about N(0, 16²) (never NaN).
func (g v4Gen) fp8(name string, n int) []byte {
	var table [256]byte
	for i := range table { // the normal quantiles of 256 equal bins, times 16
		table[i] = quant.Float32ToE4M3(float32(16 * math.Sqrt2 * math.Erfinv(2*(float64(i)+0.5)/256-1)))
	}
	buf := g.bytes(name, n)
	for i, b := range buf {
		buf[i] = table[b]
	}
	return buf
}

// pow2Scales is n power-of-two scales within a factor 2 of s, as E8M0 codes
// or float32.
func (g v4Gen) pow2Scales(name string, n int, s float64, sd quant.ScaleDType) []byte {
	e := int(math.Round(math.Log2(s))) + 127
	buf := g.bytes(name, n)
	out := make([]byte, 0, n*sd.Size())
	for _, b := range buf {
		c := uint8(e + int(b%3) - 1)
		if sd == quant.ScaleF32 {
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(quant.E8M0ToFloat32(c)))
		} else {
			out = append(out, c)
		}
	}
	return out
}

// mtpTensors is a small stand-in for the released MTP block (mtp.0.*: its
// FP8 e_proj and h_proj and its norms), which the engine must skip.
func (d DeepseekV4) mtpTensors(lin linFunc, dense denseFunc) {
	D := d.Hidden
	lin("mtp.0.e_proj", countNever, D, D)
	lin("mtp.0.h_proj", countNever, D, D)
	for _, n := range []string{"enorm", "hnorm", "norm"} {
		dense("mtp.0."+n+".weight", weights.BF16, 1, 0.05, countNever, D)
	}
}

// releasedConfig adds the released config.json's fields to cfg (and drops
// those it does not have).
func (d DeepseekV4) releasedConfig(cfg map[string]any, mlp []string) {
	ratios := []int{}
	for _, t := range d.LayerTypes {
		switch t {
		case V4CSA:
			ratios = append(ratios, 4)
		case V4HCA:
			ratios = append(ratios, 128)
		default:
			ratios = append(ratios, 0)
		}
	}
	cfg["compress_ratios"] = append(ratios, 0) // the MTP layer's
	hash := 0
	for _, t := range mlp {
		if t == V4HashMoE {
			hash++
		}
	}
	cfg["num_hash_layers"] = hash
	cfg["qk_rope_head_dim"] = d.RopeDim
	cfg["num_nextn_predict_layers"] = 1
	cfg["quantization_config"] = map[string]any{"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
		"scale_fmt": "ue8m0", "weight_block_size": []int{128, 128}}
	cfg["expert_dtype"] = "fp4"
	switch d.Released {
	case V4FP8Base:
		cfg["expert_dtype"] = "fp8"
	case V4FP8NVFP4:
		cfg["moe_quant_algo"] = "NVFP4"
	}
	cfg["rope_scaling"] = map[string]any{"type": "yarn", "factor": 16, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
	for _, k := range []string{"layer_types", "mlp_layer_types", "partial_rotary_factor", "rope_parameters"} {
		delete(cfg, k)
	}
}
