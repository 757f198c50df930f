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
// This package owns GPU memory, streams and kernels; it knows no architecture
// and reads no files.
package kernels
