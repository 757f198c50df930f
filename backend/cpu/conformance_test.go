package cpu_test

import (
	"testing"

	"github.com/manifoldlm/manifold/backend/conformance"
	"github.com/manifoldlm/manifold/backend/cpu"
)

// TestConformance runs the op table (backend/conformance) on the CPU
// backend, with one thread and with several.
func TestConformance(t *testing.T) {
	for _, threads := range []int{1, 3} {
		t.Run(cpu.New(threads).Name(), func(t *testing.T) { conformance.Run(t, cpu.New(threads)) })
	}
}
