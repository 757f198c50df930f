package kernels

import "testing"

// TestPaceOf holds the rule for pacing an m = 1 launch's first ring fill:
// only a long launch, not the SwiGLU one, right after a long launch, with
// programmatic dependent launch on (the dev build's other paces:
// TestPaceOfDev).
func TestPaceOf(t *testing.T) {
	for _, tc := range []struct {
		long, afterLong, swiglu, pdl bool
		want                         int
	}{
		{true, true, false, true, defaultTMAPace}, // the down projection after the gate and up matmuls
		{true, false, false, true, 0},             // after a short launch
		{true, true, true, true, 0},               // the gate and up matmuls with SwiGLU
		{false, true, false, true, 0},             // a short launch: its whole work fits in its ring
		{true, true, false, false, 0},             // no overlap between launches
	} {
		b := &Backend{pdl: tc.pdl, exp: newExperiments()}
		if got := b.paceOf(tc.long, tc.afterLong, tc.swiglu); got != tc.want {
			t.Errorf("%+v: pace %d, want %d", tc, got, tc.want)
		}
	}
	// Llama-3-8B's m = 1 shapes on 132 multiprocessors (two blocks each):
	// rings of 4 slots at K = 14336 and 5 at K = 4096; a partial last stage
	// counts as a stage.
	for _, tc := range []struct {
		name               string
		K, total, grid, ns int
		want               bool
	}{
		{"down 4096x14336", 14336, 256, 256, 4, true},
		{"gate/up 2x14336x4096", 4096, 1792, 256, 5, true},
		{"14336x4096", 4096, 896, 224, 5, true},
		{"q, k, v 6144x4096", 4096, 384, 192, 5, false},
		{"output 4096x4096", 4096, 256, 256, 5, false},
		// Qwen3-4B's down projection: 4 full stages and a partial one a tile, 4 slots.
		{"down 2560x9728", 9728, 160, 160, 4, true},
	} {
		if got := longGemv(tc.K, tc.total, tc.grid, tc.ns); got != tc.want {
			t.Errorf("%s: long %v, want %v", tc.name, got, tc.want)
		}
	}
}
