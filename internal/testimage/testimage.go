// Package testimage lets tests run the CUDA backend (package kernels) with
// a kernel image other than the one embedded in the binary: an image built
// on a GPU machine for test binaries built before it (kernels/gpu.sh run
// with REBUILD=1 or DEV=1). Only tests use it; a production build loads the
// embedded image and reads no environment variable.
package testimage

import (
	"fmt"
	"os"
)

// Image, when not nil, is loaded by kernels.New instead of the embedded
// image. Tests set it (FromEnv) before opening a backend.
var Image []byte

// FromEnv sets Image from the file MANIFOLD_KERNEL_IMAGE names, if it
// names one; a test binary's init calls it.
func FromEnv() {
	path := os.Getenv("MANIFOLD_KERNEL_IMAGE")
	if path == "" {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		panic(fmt.Sprintf("MANIFOLD_KERNEL_IMAGE: %v", err))
	}
	Image = b
}
