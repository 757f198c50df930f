package engine

import (
	"context"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

var longCPU = flag.Bool("longrope.cpu", false, "TestLongRoPE: also run the positions beyond 2048 on the CPU (minutes)")

// TestLongRoPE runs two layers of Qwen3-8B (hidden 4096, heads 32/8 of 128,
// rope_theta 1e6) with random bf16 weights through the public API (prefill,
// then one token at a time) and compares the logits at positions near 1,000
// and 30,000 with transformers' (testdata/longrope.safetensors, written by
// testdata/gen_longrope.py from the same seeded checkpoint). A rotary
// frequency off by a bf16 rounding shifts a phase by position × frequency ×
// 2^-9, so this catches at real lengths what the short golden fixtures
// cannot. The CPU runs the rows below 2048 (the rest with -longrope.cpu);
// the GPU runs every row.
func TestLongRoPE(t *testing.T) {
	fx, err := weights.Open(filepath.Join("testdata", "longrope.safetensors"))
	if err != nil {
		t.Skipf("fixture: %v", err)
	}
	defer fx.Close()
	ids := golden.Int32s(t, fx, "input_ids")
	pos := golden.Int32s(t, fx, "positions")
	want, shape := golden.Float32s(t, fx, "logits")
	if len(shape) != 2 || shape[0] != len(pos) {
		t.Fatalf("fixture: logits %v for %d positions", shape, len(pos))
	}
	vocab := shape[1]
	spec, err := testmodel.Shape("qwen3-8b-2l-bf16")
	if err != nil {
		t.Fatal(err)
	}
	dir := testmodel.WriteTemp(t, spec)
	devices := testDevices()
	for _, device := range devices {
		t.Run(device, func(t *testing.T) {
			limit := len(ids)
			if device == "cpu" && !*longCPU {
				limit = 2048
			}
			_, s := openSession(t, dir, Options{Device: device, ContextLength: len(ids)})
			start := time.Now()
			worst := map[bool]float64{}
			for r, p := range pos {
				if int(p) >= limit {
					break
				}
				feed := make([]int, 0, int(p)+1-s.Len())
				for _, id := range ids[s.Len() : p+1] {
					feed = append(feed, int(id))
				}
				got, err := s.Append(context.Background(), feed)
				if err != nil {
					t.Fatal(err)
				}
				d := 0.0
				for j, v := range got {
					d = math.Max(d, math.Abs(float64(v-want[r*vocab+j])))
				}
				far := p >= 10000
				worst[far] = math.Max(worst[far], d)
				if d > 2e-3 {
					t.Errorf("position %d: max |logit - transformers| %.3g > 2e-3", p, d)
				}
			}
			t.Logf("%s: max |logit - transformers| %.3g at positions near 1,000, %.3g near 30,000 (%v)",
				device, worst[false], worst[true], time.Since(start).Round(time.Millisecond))
		})
	}
	_ = os.Stdout
}
