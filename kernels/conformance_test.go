package kernels

import (
	"testing"

	"github.com/manifoldlm/manifold/backend/conformance"
)

// TestConformance runs the op table (backend/conformance) on the GPU, once
// with the default kernel choices and once per variant a default path can
// choose for other shapes or GPUs (conformanceVariants), so that every
// kernel a default path launches is held to the reference math.
func TestConformance(t *testing.T) {
	for _, v := range conformanceVariants {
		t.Run(v.name, func(t *testing.T) {
			g := newGPU(t)
			g.force = v.force
			conformance.Run(t, g)
		})
	}
}

// conformanceVariants force the kernel variants that the default rules pick
// only for other shapes or devices.
var conformanceVariants = []struct {
	name  string
	force variants
}{
	{"default", variants{}},
	{"gemm-at-m1", variants{gemvOff: true}},
	{"m1-x-streamed", variants{gemvPipe: true}},
	{"m1-one-tile", variants{gemvOneTile: true}},
	{"m1-without-bulk-copy", variants{noGemvTMA: true}},
	{"m1-bulk-copy-rows", variants{tmaRows: true}},
	{"m1-tensor-maps-all", variants{tmaMapsAll: true}},
	{"gemm-k128", variants{gemmK128: true}},
	{"gemm-k256", variants{gemmK256: true}},
	{"bf16-gemm-every-m", variants{g16All: true}},
	{"bf16-gemm-t16-split3", variants{g16Tile: 16, g16Splits: 3}},
	{"bf16-gemm-t128-unsplit", variants{g16Tile: 128, g16Splits: 1}},
	{"bf16-gemv-prefetch", variants{bf16Kernel: "gemv_bf16_pf"}},
	{"attention-kv", variants{attnKV: true}},
	{"attention-global-merge", variants{attnGlobal: true}},
	{"attention-no-short", variants{attnNoShort: true}},
	{"attention-no-multicast", variants{attnNoCast: true}},
	{"sink-attention-without-mma", variants{attnMMAOff: true}},
	{"sink-attention-mma-8-warps", variants{attnMMA8: true}},
	{"indexer-scores-without-mma", variants{idxMMAOff: true}},
	{"top-k-many-blocks", variants{topkPath: topkMany}},
	{"top-k-one-block", variants{topkPath: topkOneBlock}},
	{"top-k-clusters-of-8", variants{tkc8: true}},
	{"fp8-gemv-every-m", variants{fp8: fp8ForceGEMV}},
	{"fp8-gemm-every-m", variants{fp8: fp8ForceGEMM}},
	{"paged-attention-split", variants{pagedKeys: 8}},
	{"paged-decode-unfused", variants{pagedUnfused: true}},
	{"paged-chunks-untiled", variants{pagedNoTiles: true}},
}
