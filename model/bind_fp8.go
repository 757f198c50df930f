package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// DeepSeek-V3's released FP8 linears: module.weight F8_E4M3 [rows, cols]
// and module.weight_scale_inv F32 [ceil(rows/128), ceil(cols/128)], the
// 128x128 block of config.json's quantization_config.weight_block_size
// (quant_method fp8), each weight the code times its block's scale. They
// upload as backend.FP8Block in that layout, sharing the checkpoint's
// memory.

// fp8BlockSize is the checkpoint's FP8 block, [128, 128] when its config
// does not say.
func (l *Loader) fp8BlockSize() (rows, cols int) {
	if q := l.quant; q != nil && q.Algo == nvfp4ckpt.AlgoFP8Block {
		return q.BlockSize[0], q.BlockSize[1]
	}
	return 128, 128
}

// fp8Linear describes the FP8 linear module whose weight is w, checking the
// weight's shape against [rows, cols] and its scale tensor's dtype and shape;
// each error names the tensor at fault.
func (l *Loader) fp8Linear(module string, w *weights.Tensor, rows, cols int) (*backend.HostWeight, error) {
	if err := checkShape(w, []int{rows, cols}); err != nil {
		return nil, err
	}
	br, bc := l.fp8BlockSize()
	s, err := l.ck.Tensor(module + ".weight_scale_inv")
	if err != nil {
		return nil, err
	}
	if s.DType != weights.F32 {
		return nil, &weights.Error{File: s.File, Tensor: s.Name,
			Err: fmt.Errorf("%w: dtype %s, the FP8 weight %s needs F32 scales", quant.ErrScale, s.DType, w.Name)}
	}
	if want := []int{(rows + br - 1) / br, (cols + bc - 1) / bc}; !slices.Equal(s.Shape, want) {
		return nil, fmt.Errorf("%w: %s: scale tensor %q has shape %v, the FP8 weight %q [%d, %d] in %dx%d blocks needs %v: %w",
			ErrConfig, s.File, s.Name, s.Shape, w.Name, rows, cols, br, bc, want, quant.ErrScale)
	}
	q, err := quant.NewFP8Block(rows, cols, br, bc, w.Data, s.Data, quant.ScaleF32)
	if err != nil {
		return nil, &weights.Error{File: s.File, Tensor: s.Name, Err: err}
	}
	return &backend.HostWeight{Name: module, Rows: rows, Cols: cols, Format: backend.FP8Block, FP8: q}, nil
}

// fp8Rows is rows [r0, r0+n) of the FP8 block weight h: the same codes and
// scale rows when r0 starts a block, else the rows dequantized to F32 (the
// float32 values transformers computes with).
func fp8Rows(h *backend.HostWeight, r0, n int) *backend.HostWeight {
	q := h.FP8
	s := &backend.HostWeight{Name: fmt.Sprintf("%s[rows %d:%d]", h.Name, r0, r0+n), Rows: n, Cols: q.Cols}
	if r0%q.BlockRows == 0 {
		_, sc := q.ScaleShape()
		size := q.ScaleDType.Size()
		b0, b1 := r0/q.BlockRows, (r0+n+q.BlockRows-1)/q.BlockRows
		s.Format = backend.FP8Block
		s.FP8 = &quant.FP8Block{Rows: n, Cols: q.Cols, BlockRows: q.BlockRows, BlockCols: q.BlockCols,
			Data: q.Data[r0*q.Cols : (r0+n)*q.Cols], Scales: q.Scales[b0*sc*size : b1*sc*size], ScaleDType: q.ScaleDType}
		return s
	}
	v := make([]float32, n*q.Cols)
	for r := range n {
		q.DequantizeRow(v[r*q.Cols:(r+1)*q.Cols], r0+r)
	}
	s.Format, s.Data = backend.F32, float32Bytes(v)
	return s
}

// float32Bytes is v as little-endian float32 bytes.
func float32Bytes(v []float32) []byte {
	out := make([]byte, 0, 4*len(v))
	for _, x := range v {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(x))
	}
	return out
}
