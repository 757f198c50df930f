//go:build !manifold_dev

package kernels

// The production build: no experiment can be switched on and no
// environment variable is read. Each method of experiments returns what the
// default path does, so that the calls fold away; dev.go (build tag
// manifold_dev) holds the experiments of kernel development and the
// environment variables that set them (dev/README.md).

// experiments is empty in the production build.
type experiments struct{}

func newExperiments() experiments { return experiments{} }

// devImage is the embedded image.
func devImage(img []byte) ([]byte, error) { return img, nil }

// devOptions are o as given.
func devOptions(o Options) Options { return o }

// setup finds no kernels beyond New's and reads no environment.
func (experiments) setup(*Backend) {}

// The NVFP4 m = 1 kernels' defaults (fuse.go: finalizeGemv).
func (experiments) gemvDec() int     { return defaultGemvDec }
func (experiments) gemvSt4() bool    { return false }
func (experiments) gemvLB() bool     { return true }
func (experiments) gemvX8() bool     { return false }
func (experiments) gemvSmallM() bool { return false }
func (experiments) gemvFlags() int   { return 0 }
func (experiments) normStaged() bool { return false }
func (experiments) normTMA() bool    { return true }
func (experiments) tmaEvict() bool   { return true }
func (experiments) mapsBySize() bool { return false }

// The bf16 GEMM multiplies both halves of x (bf16.cuh).
func (experiments) gemm16Hi() bool { return false }

// tmaGrid, tmaShare and paceOf leave the default's rule in place.
func (experiments) tmaGrid(total, sms int) (int, bool)                   { return 0, false }
func (experiments) tmaShare(maxShare int) (int, bool)                    { return 0, false }
func (experiments) paceOf(long, afterLong, swiglu, pdl bool) (int, bool) { return 0, false }

// tmaKernel keeps gemv_nvfp4_tma8; gemvAblate adds no flags, gemvTimeline
// no timeline.
func (experiments) tmaKernel(*op)                              {}
func (experiments) gemvAblate(o *op, g *gemvOp, flags int) int { return flags }
func (experiments) gemvTimeline(flags int) uint64              { return 0 }

// The one-row attentions: no ablation, no trace.
func (experiments) attnAblate() int              { return 0 }
func (experiments) attnSkip() bool               { return false }
func (experiments) attnTrace(*queue, int) uint64 { return 0 }

// skip leaves every launch in.
func (experiments) skip(*op) bool { return false }
