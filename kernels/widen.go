package kernels

import (
	"errors"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// The GPU runs FP8 block-scaled weights as stored where its kernels take
// them (fp8.go: 128x128 tiles, K % 16 == 0) and NVFP4; the other
// block-scaled weights of released checkpoints are stored in a format it
// runs, with the same values the CPU computes with (widen). MXFP4 becomes
// NVFP4 by an exact re-blocking (quant.MXFP4.ToNVFP4: the same E2M1 codes,
// each power-of-two block scale as an E4M3 scale times a global scale), so
// its bytes grow by 6% only (the grouped NVFP4 MoE kernels take it). FP8
// weights the kernels do not take are dequantized row by row as the CPU
// does (quant.FP8Block.DequantizeRow) and kept in bfloat16 where every value
// survives the rounding (E4M3 codes times power-of-two scales do, unless a
// scale is extreme), else in float32: twice or four times their bytes.

// widen returns h in a format the GPU's kernels take, holding the values
// the CPU backend computes with; other formats come back as they are. FP8
// weights the FP8 kernels take come back as they are if keepFP8 (the
// default; false widens them too, the benchmarks' baseline).
func widen(h *backend.HostWeight, keepFP8 bool) (*backend.HostWeight, error) {
	switch h.Format {
	case backend.MXFP4:
		q, err := h.MX.ToNVFP4()
		if errors.Is(err, quant.ErrNotLossless) {
			return dense(h, h.MX.DequantizeRow), nil
		}
		if err != nil {
			return nil, fmt.Errorf("weight %s: %w", h.Name, err)
		}
		return &backend.HostWeight{Name: h.Name, Rows: h.Rows, Cols: h.Cols, Format: backend.NVFP4, Q: q, Bias: h.Bias}, nil
	case backend.FP8Block:
		if keepFP8 && fp8Kept(h) {
			return h, nil
		}
		return dense(h, h.FP8.DequantizeRow), nil
	}
	return h, nil
}

// dense dequantizes h's rows with row into bfloat16 when every value is
// exact in it, else float32.
func dense(h *backend.HostWeight, row func(dst []float32, r int)) *backend.HostWeight {
	v := make([]float32, h.Rows*h.Cols)
	exact := true
	for r := range h.Rows {
		dst := v[r*h.Cols : (r+1)*h.Cols]
		row(dst, r)
		for _, x := range dst {
			if exact && math.Float32bits(x)&0xffff != 0 {
				exact = false
			}
		}
	}
	d := &backend.HostWeight{Name: h.Name, Rows: h.Rows, Cols: h.Cols, Bias: h.Bias}
	if exact {
		d.Format, d.Data = backend.BF16, make([]byte, 2*len(v))
		quant.EncodeBF16(d.Data, v) // exact: the low 16 bits are zero
	} else {
		d.Format, d.Data = backend.F32, f32Bytes(v)
	}
	return d
}
