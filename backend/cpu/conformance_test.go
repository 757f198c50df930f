package cpu_test

import (
	"testing"

	"github.com/manifoldlm/manifold/backend/conformance"
	"github.com/manifoldlm/manifold/backend/cpu"
)

// TestConformance runs the op table (backend/conformance) on the CPU
// backend, with one thread and with several: its default kernels (NVFP4
// with int8 activations, the table's Q8 tolerances) and its float32
// reference kernels (the table's tolerances, as the GPU).
func TestConformance(t *testing.T) {
	for _, threads := range []int{1, 3} {
		t.Run(cpu.New(threads).Name(), func(t *testing.T) { conformance.RunQ8(t, cpu.New(threads)) })
	}
	ref := cpu.NewWithOptions(cpu.Options{Threads: 2, ReferenceNVFP4: true})
	t.Run("reference", func(t *testing.T) { conformance.Run(t, ref) })
}
