package cpu

import (
	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// Block-scaled weights without a fused kernel (FP8 E4M3 with 128x128 tile
// scales here, MXFP4 in mxfp4.go) are multiplied by decoding one weight row
// into float32 and dotting it with every input row: the reference, correct
// before fast.

// decodedWeight returns the row decoder of a block-scaled host weight, or nil
// for a format the other paths handle.
func decodedWeight(h *backend.HostWeight) quant.RowDecoder {
	switch h.Format {
	case backend.FP8Block:
		return h.FP8
	case backend.MXFP4:
		return mxfp4Decoder(h)
	}
	return nil
}

// matmulDecoded computes out[i, r] for output features r in [lo, hi) of a
// row-decoded weight.
func matmulDecoded(out, x []float32, w quant.RowDecoder, m, K, N, lo, hi int) {
	row := make([]float32, K)
	for r := lo; r < hi; r++ {
		w.DequantizeRow(row, r)
		for i := 0; i < m; i++ {
			out[i*N+r] = dotF32(x[i*K:(i+1)*K], row)
		}
	}
}
