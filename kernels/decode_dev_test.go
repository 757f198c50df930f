//go:build manifold_dev

package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/layers"
)

// The dev build's tests (go test -tags manifold_dev ./kernels): the
// experiments of dev.go against the CPU, with the dev image
// (kernels/build.sh dev; MANIFOLD_KERNEL_IMAGE=$PWD/kernels/manifold-dev.fatbin).

// needDevKernels skips the test when the loaded image lacks a kernel only
// the dev image has.
func needDevKernels(t testing.TB, g *Backend, names ...string) {
	t.Helper()
	for _, name := range names {
		if g.fn[name] == 0 {
			t.Skipf("%s is in the dev image only: kernels/build.sh dev, then MANIFOLD_KERNEL_IMAGE=<repo>/kernels/manifold-dev.fatbin", name)
		}
	}
}

// devBenchGPU is the GPU of a benchmark of dev kernels (skipped where the
// loaded image lacks kernel), CUDA graphs off, programmatic dependent
// launch on or off.
func devBenchGPU(b *testing.B, kernel string, pdl bool) *Backend {
	g := newGPU(b)
	needDevKernels(b, g, kernel)
	g.SetGraphs(GraphsOff)
	g.SetPDL(pdl)
	return g
}

// needDevImage skips the test unless the loaded image is a dev image (which
// the tracing instances mark).
func needDevImage(t *testing.T, g *Backend) {
	t.Helper()
	needDevKernels(t, g, "gemv_nvfp4_tma8_trace")
}

// TestDecodeStepDev is TestDecodeStepFusedAndGraphed with the integer E2M1
// decoding (the _d0 kernels) and the RMSNorms fused into the staged kernels
// (MANIFOLD_NORM_FUSION=1), with graphs and without.
func TestDecodeStepDev(t *testing.T) {
	g := newGPU(t)
	needDevKernels(t, g, "gemv_nvfp4_s1_d0", "gemv_nvfp4_m1_d0")
	for _, graphs := range []GraphMode{GraphsOn, GraphsOff} {
		t.Run(fmt.Sprintf("dec0/graphs=%v", graphs), func(t *testing.T) {
			testDecodeStep(t, 0, graphs, 0, func(g *Backend) { g.exp.dec, g.exp.stagedNorm = 0, true })
		})
	}
}

// TestNormFusedStaged: RMSNorm of one row fused into the staged NVFP4
// kernels (MANIFOLD_NORM_FUSION=1), which production leaves apart, and into
// gemv_nvfp4_tma8 as production does.
func TestNormFusedStaged(t *testing.T) {
	g, c := newGPU(t), refCPU()
	g.exp.stagedNorm = true
	rng := rand.New(rand.NewPCG(13, 14))
	// {300, 512} on the staged kernel (gemv_nvfp4_tma8 would take it), {40,
	// 4096} and {300, 6144} on gemv_nvfp4_tma8, then on the staged kernel.
	for i, sh := range [][2]int{{300, 512}, {40, 4096}, {300, 6144}, {40, 4096}, {300, 6144}} {
		g.force.noGemvTMA = i == 0 || i >= 3
		normThenMatMul(t, g, c, rng, sh[0], sh[1])
	}
}

// TestPaceOfDev: another pace, and every launch paced (MANIFOLD_TMA_PACE,
// MANIFOLD_TMA_PACE_ALL). No GPU needed.
func TestPaceOfDev(t *testing.T) {
	for _, tc := range []struct {
		long, afterLong, swiglu, pdl, all bool
		pace, want                        int
	}{
		{false, false, true, false, true, defaultTMAPace, defaultTMAPace},
		{false, false, false, false, true, 3, 3},
		{true, true, false, true, false, 2, 2},
		{true, false, false, true, false, 2, 0},
		{true, true, false, true, false, 0, 0},
	} {
		b := &Backend{pdl: tc.pdl, exp: newExperiments()}
		b.exp.pace, b.exp.paceAll = tc.pace, tc.all
		if got := b.paceOf(tc.long, tc.afterLong, tc.swiglu); got != tc.want {
			t.Errorf("%+v: pace %d, want %d", tc, got, tc.want)
		}
	}
}

// TestSmallMDecodeKernels holds the decode-shape NVFP4 kernels at 2 <= m <=
// 16 (benchmarked against the GEMM, which production uses there) to
// the CPU backend; tolerance as TestMatMul's for NVFP4.
func TestSmallMDecodeKernels(t *testing.T) {
	g, c := newGPU(t), refCPU()
	needDevKernels(t, g, "gemv_nvfp4_m8_d1", "gemv_nvfp4_m16_d1")
	g.exp.smallM = true
	rng := rand.New(rand.NewPCG(15, 16))
	for _, sh := range []struct{ m, n, k int }{{5, 100, 512}, {16, 256, 4096}, {9, 40, 768}, {2, 24, 256}} {
		h := hostWeight(rng, backend.NVFP4, sh.n, sh.k)
		wc, _ := c.Upload(h)
		wg, err := g.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		x := randn(rng, sh.m*sh.k)
		want := make(cpu.Buffer, sh.m*sh.n)
		c.MatMul(want, cpu.Buffer(x), wc, sh.m)
		out := g.NewBuffer(sh.m * sh.n)
		g.MatMul(out, toGPU(g, x), wg, sh.m)
		if e := relErr(fromGPU(t, g, out), want); e > 1e-3 {
			t.Errorf("%+v: relative error %.3g", sh, e)
		}
	}
}

// TestGemvTMADev holds the bulk-copy kernels' variants to the CPU, the dev
// build's among them: 16 or 8 consumer warps, one to three blocks per
// multiprocessor (even or uneven tile counts), persistent or a few tiles
// per block, a ring of 2 slots or the deepest that fits, row copies or
// tensor copies, evict-first or not, paces of 0 to 3 (in every launch
// too).
func TestGemvTMADev(t *testing.T) {
	g, c := newGPU(t), refCPU()
	needDevKernels(t, g, "gemv_nvfp4_tma", "gemv_nvfp4_tma8_3")
	rng := rand.New(rand.NewPCG(17, 18))
	// pace: the first ring fill's (paceAll: in every launch, the small too).
	const p = defaultTMAPace
	for _, v := range []struct {
		warps, occ, slots, tpb, pace int
		uneven, evict, maps, paceAll bool
	}{{16, 1, 0, 0, p, false, false, false, false}, {16, 1, 2, 0, 3, false, false, false, true}, {8, 2, 0, 0, p, false, true, false, false},
		{8, 2, 0, 0, p, true, false, false, false}, {8, 3, 0, 1, p, false, false, false, false}, {8, 2, 2, 3, p, false, false, false, false},
		{8, 2, 0, 0, p, false, true, true, false}, {8, 2, 2, 0, p, false, false, true, false}, {8, 2, 0, 0, 0, false, true, true, false},
		{8, 2, 0, 0, 1, false, true, true, true}, {8, 2, 0, 0, 2, false, true, false, true}} {
		g.exp.tmaWarps, g.exp.tmaOcc, g.force.tmaSlots, g.force.tmaTPB, g.exp.tmaUneven, g.exp.noEvict = v.warps, v.occ, v.slots, v.tpb, v.uneven, !v.evict
		g.force.tmaRows, g.force.tmaMapsAll, g.exp.pace, g.exp.paceAll = !v.maps, v.maps, v.pace, v.paceAll
		for _, sh := range gemvTMAShapes {
			checkGemvTMA(t, g, c, rng, sh[0], sh[1], v.maps, fmt.Sprintf("%+v", v))
		}
	}
}

// TestAttnTrace: attn_decode's per-block timeline (StartAttnTrace) records
// every traced launch and leaves its output as it is untraced.
func TestAttnTrace(t *testing.T) {
	g := newGPU(t)
	needDevImage(t, g)
	rng := rand.New(rand.NewPCG(35, 36))
	const heads, kvHeads, hd, T = 32, 8, 128, 120
	s := layers.AttentionShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, Scale: float32(1 / math.Sqrt(hd))}
	gc, err := g.NewKVCache(backend.KVShape{Layers: 1, KVHeads: kvHeads, HeadDim: hd, Capacity: T + 1})
	if err != nil {
		t.Fatal(err)
	}
	q, k, v := toGPU(g, randn(rng, heads*hd)), toGPU(g, randn(rng, kvHeads*hd)), toGPU(g, randn(rng, kvHeads*hd))
	out := g.NewBuffer(heads * hd)
	for pos := range T {
		g.Attention(out, q, k, v, gc, 0, pos, 1, s)
	}
	want := fromGPU(t, g, out)
	if err := g.StartAttnTrace(); err != nil {
		t.Fatal(err)
	}
	const launches = 3
	for range launches {
		g.Attention(out, q, k, v, gc, 0, T-1, 1, s) // the same position again: the same grid and output
	}
	sum, err := g.StopAttnTrace()
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sum)
	if n := strings.Count(sum, "RESULT attn_trace launch="); n != launches {
		t.Errorf("%d launches summarized, want %d:\n%s", n, launches, sum)
	}
	for _, field := range []string{" entry=", " waited=", " q=", " chunk=", " loop=", " end=", " period="} {
		if !strings.Contains(sum, field) {
			t.Errorf("summary without%s:\n%s", field, sum)
		}
	}
	if e := relErr(fromGPU(t, g, out), want); e > 0 {
		t.Errorf("traced output differs from the untraced one: relative error %.3g", e)
	}
	if _, err := g.StopAttnTrace(); err == nil {
		t.Error("a second StopAttnTrace returned no error")
	}
}

// TestAttnTraceLayout: the trace layout StopAttnTrace reads is the one
// attn_decode writes (decode.cuh's ATTD_TR_* defines). Needs no GPU.
func TestAttnTraceLayout(t *testing.T) {
	src, err := os.ReadFile("decode.cuh")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#define (ATTD_TR_\w+) +(\d+)`).FindAllStringSubmatch(string(src), -1) {
		v, _ := strconv.Atoi(m[2])
		defines[m[1]] = v
	}
	for _, c := range []struct {
		name string
		want int
	}{
		{"ATTD_TR_LAUNCHES", attnTraceLaunches},
		{"ATTD_TR_BLOCKS", attnTraceBlocks},
		{"ATTD_TR_HEAD", attnTraceHead},
		{"ATTD_TR_WAITED", attnTraceWaited},
		{"ATTD_TR_SM", attnTraceSM},
	} {
		if v, ok := defines[c.name]; !ok || v != c.want {
			t.Errorf("decode.cuh: %s = %d (defined: %v), profile.go has %d", c.name, v, ok, c.want)
		}
	}
	if 2*attnTraceHead != attnTraceBlocks {
		t.Errorf("the trace's head holds %d 32-bit counters for %d blocks", 2*attnTraceHead, attnTraceBlocks)
	}
}
