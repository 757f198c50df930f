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
			v.set(g)
			conformance.Run(t, g)
		})
	}
}

// conformanceVariants force the kernel variants that the default rules pick
// only for other shapes or devices.
var conformanceVariants = []struct {
	name string
	set  func(*Backend)
}{
	{"default", func(*Backend) {}},
	{"gemm-at-m1", func(g *Backend) { g.force.gemvOff = true }},
	{"m1-x-streamed", func(g *Backend) { g.force.gemvPipe = true }},
	{"m1-one-tile", func(g *Backend) { g.force.gemvOneTile = true }},
	{"m1-without-bulk-copy", func(g *Backend) { g.force.noGemvTMA = true }},
	{"m1-bulk-copy-rows", func(g *Backend) { g.force.tmaRows = true }},
	{"m1-tensor-maps-all", func(g *Backend) { g.force.tmaMapsAll = true }},
	{"gemm-k128", func(g *Backend) { g.force.gemmK128 = true }},
	{"gemm-k256", func(g *Backend) { g.force.gemmK256 = true }},
	{"attention-kv", func(g *Backend) { g.force.attnKV = true }},
	{"attention-global-merge", func(g *Backend) { g.force.attnGlobal = true }},
	{"attention-no-short", func(g *Backend) { g.force.attnNoShort = true }},
	{"attention-no-multicast", func(g *Backend) { g.force.attnNoCast = true }},
}
