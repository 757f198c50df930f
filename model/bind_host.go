package model

import (
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// LinearSplit uploads the linear layer module, a [sum(parts), cols] weight,
// as consecutive row blocks of parts[0], parts[1], ... rows, each in the
// stored format: NVFP4 in either checkpoint layout (a block keeps the
// tensor's global scale and shares its memory) or F32/BF16/F16. The
// module's bias, when present, is split alike. It is for weights the model
// applies as several matmuls (DeepSeek's kv_a_proj_with_mqa, V4's grouped
// wo_a).
func (l *Loader) LinearSplit(module string, cols int, parts ...int) ([]backend.Weight, error) {
	rows := 0
	for _, n := range parts {
		if n <= 0 {
			return nil, fmt.Errorf("model: %s: row block of %d rows", module, n)
		}
		rows += n
	}
	h, err := l.hostLinear(module, rows, cols)
	if err != nil {
		return nil, err
	}
	var bias []float32
	if l.Has(module + ".bias") {
		if bias, err = l.Float32(module+".bias", rows); err != nil {
			return nil, err
		}
	}
	out := make([]backend.Weight, len(parts))
	r0 := 0
	for i, n := range parts {
		s := &backend.HostWeight{Name: fmt.Sprintf("%s[rows %d:%d]", h.Name, r0, r0+n), Rows: n, Cols: cols, Format: h.Format}
		switch {
		case h.Q != nil:
			s.Q = nvfp4Rows(h.Q, r0, n)
		case h.FP8 != nil:
			s.FP8 = fp8Rows(h.FP8, r0, n)
		case h.MX != nil:
			s.MX = &quant.MXFP4{Rows: n, Cols: cols,
				Packed: h.MX.Packed[r0*cols/2 : (r0+n)*cols/2],
				Scales: h.MX.Scales[r0*cols/quant.MXFP4BlockSize : (r0+n)*cols/quant.MXFP4BlockSize]}
		default:
			size := len(h.Data) / (rows * cols)
			s.Data = h.Data[r0*cols*size : (r0+n)*cols*size]
		}
		if bias != nil {
			s.Bias = bias[r0 : r0+n]
		}
		if out[i], err = l.b.Upload(s); err != nil {
			return nil, err
		}
		r0 += n
	}
	return out, nil
}

// nvfp4Rows is rows [r0, r0+n) of q, sharing its memory and global scale.
func nvfp4Rows(q *quant.NVFP4, r0, n int) *quant.NVFP4 {
	half, nb := q.Cols/2, q.Cols/quant.NVFP4BlockSize
	return &quant.NVFP4{Rows: n, Cols: q.Cols,
		Packed:      q.Packed[r0*half : (r0+n)*half],
		Scales:      q.Scales[r0*nb : (r0+n)*nb],
		GlobalScale: q.GlobalScale, InputScale: q.InputScale}
}

// fp8Rows is rows [r0, r0+n) of q. A block aligned on q's tiles shares q's
// memory; otherwise the codes are shared and each row gets its tile's scales
// (a one-row tile), so the values are exactly q's.
func fp8Rows(q *quant.FP8Block, r0, n int) *quant.FP8Block {
	_, sc := q.ScaleShape()
	size := q.ScaleDType.Size()
	s := &quant.FP8Block{Rows: n, Cols: q.Cols, BlockRows: q.BlockRows, BlockCols: q.BlockCols,
		Data: q.Data[r0*q.Cols : (r0+n)*q.Cols], ScaleDType: q.ScaleDType}
	if r0%q.BlockRows == 0 && (n%q.BlockRows == 0 || r0+n == q.Rows) {
		t0, t1 := r0/q.BlockRows, (r0+n+q.BlockRows-1)/q.BlockRows
		s.Scales = q.Scales[t0*sc*size : t1*sc*size]
		return s
	}
	s.BlockRows = 1
	s.Scales = make([]byte, 0, n*sc*size)
	for r := r0; r < r0+n; r++ {
		t := r / q.BlockRows
		s.Scales = append(s.Scales, q.Scales[t*sc*size:(t+1)*sc*size]...)
	}
	return s
}
