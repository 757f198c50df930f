package nvfp4ckpt

import (
	"strings"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
)

// DeepSeek's block-scaled layouts, read as released (no conversion step):
//
//   - FP8 block: "weight" F8_E4M3 [N, K] and one scale per tile of the
//     config's weight_block_size (128x128 in V3 and V4), in "scale"
//     (DeepSeek-V4: F8_E8M0, or F32 powers of two in the -Base checkpoints)
//     or "weight_scale_inv" (DeepSeek-V3: F32), shape [ceil(N/128),
//     ceil(K/128)]; w = e4m3 * scale.
//   - MXFP4: "weight" I8 (or U8) [N, K/2], two E2M1 codes a byte, even
//     element in the low nibble, and "scale" F8_E8M0 [N, K/32] (DeepSeek-V4's
//     routed experts). A packed weight with a "weight_scale" is NVFP4 instead.
const (
	SuffixScale          = ".scale"
	SuffixWeightScaleInv = ".weight_scale_inv"
)

// DefaultFP8Block is the FP8 tile of DeepSeek-V3 and V4 when the config
// gives no weight_block_size.
var DefaultFP8Block = [2]int{128, 128}

// IsMXFP4 reports whether module prefix is stored as MXFP4: a packed (I8 or
// U8) weight with a ".scale" and no ".weight_scale".
func IsMXFP4(c *weights.Checkpoint, prefix string) bool {
	w, err := c.Tensor(prefix + SuffixWeight)
	return err == nil && (w.DType == weights.I8 || w.DType == weights.U8) &&
		c.Has(prefix+SuffixScale) && !c.Has(prefix+SuffixWeightScale)
}

// LoadFP8Block reads the FP8 block-scaled linear at module prefix, with
// block (rows, columns) tiles. The weight and scales alias the checkpoint's
// memory. Errors name the file and tensor and wrap ErrUnsupportedDType,
// ErrMissingScale, ErrBadTensor or quant.ErrNonFinite.
func LoadFP8Block(c *weights.Checkpoint, prefix string, block [2]int) (*quant.FP8Block, error) {
	w, err := c.Tensor(prefix + SuffixWeight)
	if err != nil {
		return nil, err
	}
	if w.DType != weights.F8E4M3 {
		return nil, tensorErr(w, ErrUnsupportedDType, "FP8 block weight must be F8_E4M3, got %s", w.DType)
	}
	if len(w.Shape) != 2 || w.Shape[0] <= 0 || w.Shape[1] <= 0 {
		return nil, tensorErr(w, ErrBadTensor, "FP8 weight shape %v, want [N, K]", w.Shape)
	}
	name := prefix + SuffixScale
	if !c.Has(name) && c.Has(prefix+SuffixWeightScaleInv) {
		name = prefix + SuffixWeightScaleInv
	}
	if !c.Has(name) {
		return nil, missing(w, prefix+SuffixScale+" (or "+SuffixWeightScaleInv+")")
	}
	s, err := c.Tensor(name)
	if err != nil {
		return nil, err
	}
	var sd quant.ScaleDType
	switch s.DType {
	case weights.F8E8M0:
		sd = quant.ScaleE8M0
	case weights.F32:
		sd = quant.ScaleF32
	default:
		return nil, tensorErr(s, ErrUnsupportedDType, "FP8 block scales must be F8_E8M0 or F32, got %s", s.DType)
	}
	m := &quant.FP8Block{Rows: w.Shape[0], Cols: w.Shape[1], BlockRows: block[0], BlockCols: block[1], Data: w.Data, Scales: s.Data, ScaleDType: sd}
	if block[0] <= 0 || block[1] <= 0 {
		return nil, tensorErr(w, ErrBadConfig, "FP8 block size %v", block)
	}
	sr, sc := m.ScaleShape()
	if len(s.Shape) != 2 || s.Shape[0] != sr || s.Shape[1] != sc {
		return nil, tensorErr(s, ErrBadTensor, "FP8 block scales shape %v, want [%d, %d] (%dx%d tiles) for weight %v", s.Shape, sr, sc, block[0], block[1], w.Shape)
	}
	if err := m.Validate(); err != nil {
		return nil, tensorErr(s, err, "")
	}
	return m, nil
}

// LoadMXFP4 reads the MXFP4 linear at module prefix. The codes and scales
// alias the checkpoint's memory. Errors name the file and tensor and wrap
// ErrUnsupportedDType, ErrMissingScale, ErrBadTensor, quant.ErrShape or
// quant.ErrNonFinite.
func LoadMXFP4(c *weights.Checkpoint, prefix string) (*quant.MXFP4, error) {
	w, s, n, k, err := packedWeight(c, prefix, "MXFP4", quant.MXFP4BlockSize, quant.ErrShape, SuffixScale)
	if err != nil {
		return nil, err
	}
	if s.DType != weights.F8E8M0 {
		return nil, tensorErr(s, ErrUnsupportedDType, "MXFP4 scales must be F8_E8M0, got %s", s.DType)
	}
	if len(s.Shape) != 2 || s.Shape[0] != n || s.Shape[1] != k/quant.MXFP4BlockSize {
		return nil, tensorErr(s, ErrBadTensor, "MXFP4 scales shape %v, want [%d, %d] (one per 32 inputs) for weight %v", s.Shape, n, k/quant.MXFP4BlockSize, w.Shape)
	}
	m, err := quant.NewMXFP4(n, k, w.Data, s.Data)
	if err != nil {
		return nil, tensorErr(s, err, "")
	}
	return m, nil
}

// V4ReleasedName is DeepSeek-V4's released name of the tensor that
// transformers' save_pretrained calls n: no "model." prefix, embed.weight,
// norm.weight, hc_head_{fn,base,scale}, layers.N.attn.kv_norm.weight; the
// names below the layer are DeepSeek's in both.
func V4ReleasedName(n string) string {
	switch n {
	case "model.embed_tokens.weight":
		return "embed.weight"
	case "model.norm.weight":
		return "norm.weight"
	}
	if rest, ok := strings.CutPrefix(n, "model.hc_head.hc_"); ok {
		return "hc_head_" + rest
	}
	n = strings.TrimPrefix(n, "model.")
	if layer, ok := strings.CutSuffix(n, ".attn.norm.weight"); ok && strings.HasPrefix(layer, "layers.") {
		return layer + ".attn.kv_norm.weight"
	}
	return n
}
