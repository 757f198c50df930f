//go:build manifold_dev

package engine

import (
	"fmt"
	"os"
	"testing"

	"github.com/manifoldlm/manifold/kernels"
)

// attnTraceSteps, with MANIFOLD_ATTN_TRACE=1: attn_decode's per-block
// timeline over one step at two contexts (kernels.Backend.StartAttnTrace,
// the dev build's, with the dev image), launched op by op.
func attnTraceSteps(b *testing.B, s *Session, gb *kernels.Backend, step func()) {
	if os.Getenv("MANIFOLD_ATTN_TRACE") != "1" {
		return
	}
	for _, n := range []int{100, 200} {
		s.Truncate(n)
		for s.Len() < n { // Truncate only shortens
			step()
		}
		step()
		step()
		if err := gb.StartAttnTrace(); err != nil {
			b.Fatal(err)
		}
		step()
		sum, err := gb.StopAttnTrace()
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("RESULT attn_trace_context keys=%d\n%s", n+3, sum)
	}
}
