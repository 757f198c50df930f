//go:build !(darwin || linux || windows)

package kernels

import (
	"errors"
	"runtime"
)

// openDriver fails: purego, which calls the driver without cgo, does not run
// on this system, so the package builds and reports no GPU (the CPU backend
// serves).
func openDriver() (uintptr, error) {
	return 0, errors.New("no CUDA driver loader for " + runtime.GOOS)
}

func driverSym(uintptr, string) (uintptr, error) { return 0, errors.New("no CUDA driver") }

func bindFunc(any, uintptr) {}

// openCublas fails here: no cuBLAS without a driver.
func openCublas() (uintptr, string, error) {
	return 0, "", errors.New("no cuBLAS loader for " + runtime.GOOS)
}
