// Package kernels is the CUDA backend: Manifold's own kernels (manifold.cu),
// their build (build.sh, run where nvcc is), the committed image they build
// to (manifold.fatbin, embedded), and the Go side that loads and launches them
// through the CUDA driver API.
//
// The driver (libcuda; nvcuda.dll on Windows) is opened at run time with
// purego, so building needs neither cgo nor CUDA headers, and the same binary
// runs on machines with and without a GPU (Available reports which). Where
// purego does not run (the BSDs without cgo, and other systems) the package
// still builds and reports no GPU (dl_*.go). Every kernel is tested against the
// CPU backend in cuda_test.go; those tests skip themselves without a GPU.
//
// New takes Options, the production settings (how work is scheduled, never
// what it computes); the package reads no environment variable. The
// experiments of kernel development (other kernels and launch shapes,
// ablations, timelines, and the environment variables that switch them)
// exist only in the dev build, -tags manifold_dev (dev.go, dev/README.md),
// and their kernels only in the dev image (build.sh dev).
//
// This package owns GPU memory, streams and kernels. It implements the op
// groups of the backend contract (backend/ops.go) and knows no model: it
// reads no config or file, and no choice in it branches on an architecture,
// only on the shapes and formats of the ops it is given (comments name the
// model shape a launch choice was measured on). Fusion is its job: the ops
// of a step are queued, and a pass over the queue joins those that can run
// as one launch (pass.go, fuse.go), so that model code is written in the
// order of the math.
package kernels
