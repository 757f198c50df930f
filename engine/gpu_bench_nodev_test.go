//go:build !manifold_dev

package engine

import (
	"testing"

	"github.com/manifoldlm/manifold/kernels"
)

// attnTraceSteps: the attention timeline is the dev build's
// (gpu_bench_dev_test.go).
func attnTraceSteps(*testing.B, *Session, *kernels.Backend, func()) {}
