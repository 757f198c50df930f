package cpu

import (
	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/quant"
)

// mxfp4Decoder is the row decoder of an MXFP4 weight (E2M1 codes, one E8M0
// scale per 32 inputs): quant.MXFP4 decodes a row exactly; matmulDecoded
// (fp8.go) dots it.
func mxfp4Decoder(h *backend.HostWeight) quant.RowDecoder { return h.MX }
