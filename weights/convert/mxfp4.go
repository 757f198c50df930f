package convert

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// DeepSeek-V4's routed experts ship as MXFP4 (E2M1 codes, an E8M0 scale per
// 32 inputs). NVFP4 keeps the codes and needs an E4M3 scale per 16 inputs
// times a per-tensor global scale: with a power-of-two global scale every
// MX scale within 17 octaves of the tensor's largest is an exact E4M3 power
// of two, so the re-blocking changes no weight (quant.MXFP4.ToNVFP4). A
// tensor whose scales span more is dequantized and quantized to NVFP4 like
// any other linear, its error reported.

// keepF32 names the float32 tensors of DeepSeek-V4's releases that the
// model computes in float32: the mHC parameters (hc_attn_*, hc_ffn_*,
// hc_head_*), the attention sinks, the compressors' ape and the router bias.
var keepF32 = regexp.MustCompile(`(^|\.)hc_|(^|\.)attn_sink$|\.ape$|\.gate\.bias$`)

// reblockMXFP4 writes the MXFP4 linear of plan p as NVFP4 (weight,
// weight_scale, weight_scale_2) and counts it in rep: Reblocked when exact,
// quantized with its error otherwise. It returns the bytes written.
func reblockMXFP4(w adder, c *weights.Checkpoint, p plan, workers int, mem *memSampler, rep *Report) (int64, error) {
	m, err := nvfp4ckpt.LoadMXFP4(c, p.module)
	if err != nil {
		return 0, err
	}
	q, err := m.ToNVFP4()
	switch {
	case errors.Is(err, quant.ErrNotLossless):
		ref := m.Dequantize()
		if q, err = quant.QuantizeNVFP4Parallel(ref, m.Rows, m.Cols, workers); err != nil {
			return 0, &weights.Error{File: p.t.File, Tensor: p.t.Name, Err: err}
		}
		e, r := q.ErrorRows(ref, 0, m.Rows)
		rep.Stats = append(rep.Stats, statOf(p.module, m.Rows, m.Cols, e, r))
		rep.Unquantizable = append(rep.Unquantizable, fmt.Sprintf("%s: MXFP4 scales span more than NVFP4 holds exactly; requantized", p.t.Name))
	case err != nil:
		return 0, &weights.Error{File: p.t.File, Tensor: p.t.Name, Err: err}
	default:
		rep.Reblocked++
	}
	rep.QuantizedParams += int64(m.Rows * m.Cols)
	mem.sample()
	return writeNVFP4(w, p.module, q)
}

// writeNVFP4 adds module's NVFP4 tensors (weight, weight_scale,
// weight_scale_2) and returns their bytes.
func writeNVFP4(w adder, module string, m *quant.NVFP4) (int64, error) {
	if err := w.Add(module+nvfp4ckpt.SuffixWeight, weights.U8, []int{m.Rows, m.Cols / 2}, m.Packed); err != nil {
		return 0, err
	}
	if err := w.Add(module+nvfp4ckpt.SuffixWeightScale, weights.F8E4M3, []int{m.Rows, m.Cols / quant.NVFP4BlockSize}, m.Scales); err != nil {
		return 0, err
	}
	gs := make([]byte, 4)
	putF32(gs, m.GlobalScale)
	if err := w.Add(module+nvfp4ckpt.SuffixWeightScale2, weights.F32, []int{}, gs); err != nil {
		return 0, err
	}
	return int64(m.Bytes() + 4), nil
}
