//go:build manifold_dev

package kernels

import (
	"fmt"
	"math"
	"os"
	"strconv"
)

// The dev build (go build/test -tags manifold_dev): the experiments of
// kernel development, which no default path takes (ablations and timelines
// whose results are wrong or slower, launch shapes and kernels measured and
// not chosen), and the environment variables that switch them on. The
// production build (dev_off.go) has none of this and reads no environment
// variable. The kernels only the experiments launch are in the dev image
// alone (kernels/build.sh dev writes kernels/manifold-dev.fatbin; run with
// MANIFOLD_KERNEL_IMAGE naming it); dev/README.md lists the switches.

// experiments are the dev build's switches; newExperiments gives the
// default path's values, which the environment (setup) and the dev tests
// change.
type experiments struct {
	dec        int    // the NVFP4 kernels' E2M1 decoding: 1 (cvt, the default) or 0 (integer operations: the _d0 kernels)
	st4        bool   // m = 1 on the 4-stage pipeline with fewer warps (gemv_nvfp4_s1_d1_st4)
	x8         bool   // m = 1 on the m <= 8 kernel (x read per chunk, no staging; MANIFOLD_GEMV_M1=m8)
	smallM     bool   // 2 <= m <= 16 on the decode-shape kernels too (gemv_nvfp4_m8_*, m16_*)
	noLB       bool   // m = 1 on the 88-register staged kernel (gemv_nvfp4_s1_d1; MANIFOLD_GEMV_M1=s1)
	flags      int    // GemvArgs.flags bits for the staged kernels (bit 0: each warp a contiguous run of K)
	stagedNorm bool   // RMSNorm of one row fused into the staged NVFP4 kernels too (MANIFOLD_NORM_FUSION=1)
	noTMANorm  bool   // ... into none, gemv_nvfp4_tma8* included (MANIFOLD_NORM_FUSION=0)
	noEvict    bool   // gemv_nvfp4_tma8*'s weight copies at normal L2 priority, not evict-first (MANIFOLD_TMA_EVICT=0)
	pace       int    // the first ring fill's pace where paceOf paces (0-7; MANIFOLD_TMA_PACE)
	paceAll    bool   // ... in every launch (MANIFOLD_TMA_PACE_ALL=1)
	bySize     bool   // tensor copies by size alone, the output projections too (MANIFOLD_TMA_MAPS=size)
	tmaWarps   int    // the bulk-copy kernel's consumer warps: 8 (the default) or 16 (gemv_nvfp4_tma, one block a multiprocessor; MANIFOLD_GEMV_TMA=16)
	tmaOcc     int    // with 8: blocks a multiprocessor, 2 (the default) or 3 (gemv_nvfp4_tma8_3)
	tmaUneven  bool   // tmaOcc blocks a multiprocessor even where their tile counts differ (MANIFOLD_TMA_UNEVEN=1)
	tmaAblate  int    // gemv_nvfp4_tma8's ablation bits (flags bits 4, 5: x not staged, weights not decoded; 6: timeline), which launch its tracing instances
	tmaTrace   uint64 // where the timeline (flags bit 6) goes, 64 words a block
	// MANIFOLD_SMALL_ABLATE (results wrong): tmaAblate bits for the launches
	// under tmaMapsMin weights, or by MANIFOLD_SMALL_ABLATE_ROLE only the
	// output projection's (o, under 20 M weights) or the q, k, v matmul's
	// (qkv); or instead the down projection's (down) or every launch from
	// tmaMapsMin (large).
	smallAblate int
	smallRole   string
	attnRec     *allocation // where attn_decode and attn_short write their per-block timeline (StartAttnTrace)
	attnMode    int         // MANIFOLD_ATTN_ABLATE (results wrong): 1 (wait) the one-row attention returns after its wait, 2 (skip) is not launched
	skipRole    string      // MANIFOLD_SKIP (results wrong): launches of one role left out (skip)
	fp8q        fp8qScratch // the FP8 tensor-core candidate's quantized x (fp8_dev.go)
	g16Hi       bool        // MANIFOLD_G16_HI=1 (results off by x's bf16 rounding): the bf16 GEMM on x's hi parts alone (gemm16_bf16_t*_hi)
}

func newExperiments() experiments {
	return experiments{dec: defaultGemvDec, pace: defaultTMAPace, tmaWarps: 8, tmaOcc: tmaOcc}
}

// devKernels are the kernels only experiments launch, with the dynamic
// shared memory they may use: in the dev image, not the production one.
var devKernels = []string{"gemv_nvfp4_m1_d0", "gemv_nvfp4_s1_d0", "gemv_nvfp4_s1_d1", "gemv_nvfp4_s1_d1_st4",
	"gemv_nvfp4_m8_d0", "gemv_nvfp4_m8_d1", "gemv_nvfp4_m16_d0", "gemv_nvfp4_m16_d1",
	"gemv_nvfp4_tma", "gemv_nvfp4_tma8_3", "gemv_nvfp4_tma8_trace", "gemv_nvfp4_tma8_tm_trace",
	"fp8_act_quant", "gemm_fp8q_t64"}

// devImage is the image MANIFOLD_KERNEL_IMAGE names (a freshly built one,
// the dev image), else img.
func devImage(img []byte) ([]byte, error) {
	if path := os.Getenv("MANIFOLD_KERNEL_IMAGE"); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("kernels: MANIFOLD_KERNEL_IMAGE: %w", err)
		}
		return b, nil
	}
	return img, nil
}

// devOptions are o with MANIFOLD_CUDA_GRAPHS (0 off, 1 on),
// MANIFOLD_CUDA_PDL (0 off) and MANIFOLD_CUDA_AHEAD (a count, 0 never)
// applied where set.
func devOptions(o Options) Options {
	switch os.Getenv("MANIFOLD_CUDA_GRAPHS") {
	case "0":
		o.Graphs = GraphsOff
	case "1":
		o.Graphs = GraphsOn
	}
	if os.Getenv("MANIFOLD_CUDA_PDL") == "0" {
		o.NoPDL = true
	}
	if v, err := strconv.Atoi(os.Getenv("MANIFOLD_CUDA_AHEAD")); err == nil && v >= 0 {
		o.LaunchAhead = v
		if v == 0 {
			o.LaunchAhead = -1
		}
	}
	return o
}

// setup looks up the dev kernels the image has (with the context current)
// and applies the environment's switches, to these and to b.force.
func (e *experiments) setup(b *Backend) {
	for _, name := range devKernels {
		var f uintptr
		if b.d.cuModuleGetFunction(&f, b.module, cString(name)) != 0 {
			continue // not in this image: a launch of it fails
		}
		b.d.cuFuncSetAttribute(f, 8, int32(b.maxShare))
		b.fn[name] = f
	}
	env := os.Getenv
	switch env("MANIFOLD_NORM_FUSION") {
	case "1":
		e.stagedNorm = true
	case "0":
		e.noTMANorm = true
	}
	switch env("MANIFOLD_GEMV_M1") {
	case "m8":
		e.x8 = true
	case "s1":
		e.noLB = true
	}
	b.force.gemvOneTile = env("MANIFOLD_GEMV_TILES") == "1"
	switch env("MANIFOLD_GEMV_TMA") {
	case "0":
		b.force.noGemvTMA = true
	case "16":
		e.tmaWarps, e.tmaOcc = 16, 1
	}
	e.noEvict = env("MANIFOLD_TMA_EVICT") == "0"
	e.tmaUneven = env("MANIFOLD_TMA_UNEVEN") == "1"
	if v, err := strconv.Atoi(env("MANIFOLD_TMA_PACE")); err == nil && v >= 0 && v < 8 {
		e.pace = v
	}
	e.paceAll = env("MANIFOLD_TMA_PACE_ALL") == "1"
	switch env("MANIFOLD_TMA_MAPS") {
	case "0":
		b.force.tmaRows = true
	case "all":
		b.force.tmaMapsAll = true
	case "size":
		e.bySize = true
	}
	b.force.attnGlobal = env("MANIFOLD_ATTN_CLUSTER") == "0"
	b.force.attnNoShort = env("MANIFOLD_ATTN_SHORT") == "0"
	b.force.attnNoCast = env("MANIFOLD_ATTN_MULTICAST") == "0"
	e.attnMode = map[string]int{"wait": 1, "skip": 2}[env("MANIFOLD_ATTN_ABLATE")]
	e.skipRole = env("MANIFOLD_SKIP")
	e.smallAblate = map[string]int{"nodec": 0x20, "nox": 0x10, "both": 0x30}[env("MANIFOLD_SMALL_ABLATE")]
	e.smallRole = env("MANIFOLD_SMALL_ABLATE_ROLE")
	e.g16Hi = env("MANIFOLD_G16_HI") == "1"
}

func (e *experiments) gemvDec() int     { return e.dec }
func (e *experiments) gemvSt4() bool    { return e.st4 }
func (e *experiments) gemvLB() bool     { return !e.noLB }
func (e *experiments) gemvX8() bool     { return e.x8 }
func (e *experiments) gemvSmallM() bool { return e.smallM }
func (e *experiments) gemvFlags() int   { return e.flags }
func (e *experiments) normStaged() bool { return e.stagedNorm }
func (e *experiments) normTMA() bool    { return !e.noTMANorm }
func (e *experiments) tmaEvict() bool   { return !e.noEvict }
func (e *experiments) mapsBySize() bool { return e.bySize }
func (e *experiments) gemm16Hi() bool   { return e.g16Hi }

// tmaThreads is gemv_nvfp4_tma's block: 16 consumer warps and the producer.
const tmaThreads = 17 * 32

// tmaGrid: one persistent block a multiprocessor with 16 consumer warps;
// with 8, tmaOcc a multiprocessor, uneven or balanced.
func (e *experiments) tmaGrid(total, sms int) (int, bool) {
	switch occ := max(e.tmaOcc, 2); {
	case e.tmaWarps != 8:
		return min(total, sms), true
	case e.tmaUneven:
		return min(total, occ*sms), true
	case occ != tmaOcc:
		return tmaBalanced(total, occ*sms), true
	}
	return 0, false
}

// tmaShare: a block's share of the shared memory, all of it with 16
// consumer warps, a tmaOcc'th with 8.
func (e *experiments) tmaShare(maxShare int) (int, bool) {
	switch occ := max(e.tmaOcc, 2); {
	case e.tmaWarps != 8:
		return maxShare, true
	case occ != tmaOcc:
		return (maxShare+1024)/occ - 1024, true
	}
	return 0, false
}

// paceOf: paceOf's rule with another pace, or every launch paced.
func (e *experiments) paceOf(long, afterLong, swiglu, pdl bool) (int, bool) {
	if e.pace == defaultTMAPace && !e.paceAll {
		return 0, false
	}
	if e.paceAll || long && afterLong && !swiglu && pdl {
		return e.pace, true
	}
	return 0, true
}

// tmaKernel: gemv_nvfp4_tma with 16 consumer warps, gemv_nvfp4_tma8_3 with
// three blocks a multiprocessor.
func (e *experiments) tmaKernel(o *op) {
	switch {
	case e.tmaWarps != 8:
		o.name, o.block = "gemv_nvfp4_tma", tmaThreads
	case e.tmaOcc > 2:
		o.name = "gemv_nvfp4_tma8_3"
	}
}

// gemvAblate adds the ablation and timeline bits to a bulk-copy launch's
// flags, and moves gemv_nvfp4_tma8 and gemv_nvfp4_tma8_tm to their tracing
// instances, the only ones that take them.
func (e *experiments) gemvAblate(o *op, g *gemvOp, flags int) int {
	ablate := e.tmaAblate
	if e.smallAblate != 0 {
		lo, hi := 0, tmaMapsMin
		switch e.smallRole {
		case "o":
			hi = 20 << 20
		case "qkv":
			lo = 20 << 20
		case "down": // the down projection (4096 x 14336: 58.7 M weights)
			lo, hi = tmaMapsMin, 64<<20
		case "large": // every launch from tmaMapsMin weights
			lo, hi = tmaMapsMin, math.MaxInt
		}
		if n := g.weights(); n >= lo && n < hi {
			ablate |= e.smallAblate
		}
	}
	if ablate != 0 && (o.name == "gemv_nvfp4_tma8" || o.name == "gemv_nvfp4_tma8_tm") {
		o.name += "_trace"
	}
	return flags | ablate
}

// gemvTimeline is where the timeline goes when flags ask for one.
func (e *experiments) gemvTimeline(flags int) uint64 {
	if flags&0x40 != 0 {
		return e.tmaTrace
	}
	return 0
}

// attnAblate is the one-row attentions' cl bit 1 (return after the wait).
func (e *experiments) attnAblate() int { return boolInt(e.attnMode == 1) << 1 }

// attnSkip leaves the one-row attentions out.
func (e *experiments) attnSkip() bool { return e.attnMode == 2 }

// attnTrace is where a one-row attention of blocks blocks writes its
// timeline (0: none), kept alive through q.
func (e *experiments) attnTrace(q *queue, blocks int) uint64 {
	if e.attnRec == nil || blocks > attnTraceBlocks {
		return 0
	}
	q.keep = append(q.keep, e.attnRec)
	return e.attnRec.ptr
}

// skip reports whether MANIFOLD_SKIP (results wrong,
// timing real; launches op by op only) leaves o out: qkv, o, gu, down (a
// Llama block's NVFP4 m = 1 matmuls by role: three weights, the residual add
// with K <= N or K > N, SwiGLU), lm (the bf16 LM head). What a decode step
// gains without a role is what that role's launches cost on its critical
// path (docs/PERFORMANCE.md round 30).
func (e *experiments) skip(o *op) bool {
	g := o.gemv
	switch e.skipRole {
	case "lm":
		return o.name == "gemv_bf16_u4"
	case "qkv":
		return g != nil && len(g.groups) == 3
	case "gu":
		return g != nil && g.mode == 1
	case "o":
		return g != nil && g.mode == 2 && g.K <= g.groups[0].w.rows
	case "down":
		return g != nil && g.mode == 2 && g.K > g.groups[0].w.rows
	}
	return false
}
