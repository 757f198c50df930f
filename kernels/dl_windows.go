package kernels

import (
	"errors"
	"syscall"

	"github.com/ebitengine/purego"
)

// openDriver opens the CUDA driver library, nvcuda.dll on Windows.
func openDriver() (uintptr, error) {
	h, err := syscall.LoadLibrary("nvcuda.dll")
	return uintptr(h), err
}

// driverSym is the address of the driver's function name.
func driverSym(lib uintptr, name string) (uintptr, error) {
	return syscall.GetProcAddress(syscall.Handle(lib), name)
}

// bindFunc makes *fn (a pointer to a func variable) call the C function at sym.
func bindFunc(fn any, sym uintptr) { purego.RegisterFunc(fn, sym) }

// openCublas fails on Windows for now (cublas64_*.dll is not searched): the
// package's own kernels serve every matmul.
func openCublas() (uintptr, string, error) {
	return 0, "", errors.New("cuBLAS is not loaded on windows")
}
