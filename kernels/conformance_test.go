package kernels

import (
	"fmt"
	"sort"
	"strings"
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
	{"m1-x-streamed", variants{gemvPipe: true, noGemvTMA: true}}, // (gemv_nvfp4_tma8 would take every K % 256 == 0)
	{"m1-one-tile", variants{gemvOneTile: true, noGemvTMA: true}},
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
	{"fp8-gemv-bulk-copy", variants{fp8: fp8ForceTMA}}, // gemv_fp8_tma at m = 1: not a default choice until measured
	{"paged-attention-split", variants{pagedKeys: 8}},
	{"paged-decode-unfused", variants{pagedUnfused: true}},
	{"paged-chunks-untiled", variants{pagedNoTiles: true}},
	// The cuBLAS path (cublas.go) at every m >= 2, bf16 weights as two GEMMs
	// (the default from blasStackedMaxM rows; the table's rows are fewer),
	// NVFP4 weights dequantized in chunks of 77 rows (the default chunks
	// only past 128 MiB); and the own GEMMs where the default takes cuBLAS
	// (the default where libcublas does not load). Without cuBLAS both are
	// the default.
	{"cublas-every-m", variants{blasAll: true, blasChunk: 77, blasStacked: 2}},
	{"own-gemms-not-cublas", variants{blasOff: true}},
}

// TestConformanceCoverage runs the table once more with the default kernel
// choices, profiled (so launched one by one, without programmatic dependent
// launch), and logs the production image's kernels it did not launch. The
// variants of TestConformance force some of those; the others are reached
// only by paths outside the table, which a change's closing note lists.
func TestConformanceCoverage(t *testing.T) {
	g := newGPU(t)
	names, err := moduleFunctions(g)
	if err != nil {
		t.Skip(err)
	}
	g.StartProfile()
	conformance.Run(t, g)
	launched := map[string]bool{}
	for _, k := range g.StopProfile() {
		launched[k.Name] = true
	}
	var missing []string
	for _, n := range names {
		if !launched[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	t.Logf("the table launched %d of the image's %d kernels with the default choices; not launched: %s",
		len(names)-len(missing), len(names), strings.Join(missing, " "))
}

// moduleFunctions lists the kernels of b's image (cuModuleEnumerateFunctions,
// CUDA 12.4 drivers and later).
func moduleFunctions(b *Backend) ([]string, error) {
	lib, err := openDriver()
	if err != nil {
		return nil, err
	}
	var (
		count func(n *uint32, mod uintptr) int32
		enum  func(fns *uintptr, n uint32, mod uintptr) int32
		name  func(s **byte, fn uintptr) int32
	)
	for _, f := range []struct {
		fn   any
		name string
	}{{&count, "cuModuleGetFunctionCount"}, {&enum, "cuModuleEnumerateFunctions"}, {&name, "cuFuncGetName"}} {
		sym, err := driverSym(lib, f.name)
		if err != nil {
			return nil, fmt.Errorf("libcuda lacks %s: %v", f.name, err)
		}
		bindFunc(f.fn, sym)
	}
	var out []string
	b.d.onContext(b.ctx, func() {
		var n uint32
		if err = b.d.check("cuModuleGetFunctionCount", count(&n, b.module)); err != nil || n == 0 {
			return
		}
		fns := make([]uintptr, n)
		if err = b.d.check("cuModuleEnumerateFunctions", enum(&fns[0], n, b.module)); err != nil {
			return
		}
		for _, f := range fns {
			var s *byte
			if err = b.d.check("cuFuncGetName", name(&s, f)); err != nil {
				return
			}
			out = append(out, goString(s))
		}
	})
	return out, err
}
