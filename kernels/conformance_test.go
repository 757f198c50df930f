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
	{"attention-without-mma", func(g *Backend) { g.attnMMAOff = true }},
	{"one-row-attention-on-attention_kv", func(g *Backend) { g.attnDecodeOff = true }},
	{"m1-without-bulk-copy", func(g *Backend) { g.gemvTMA = false }},
}
