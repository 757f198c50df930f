//go:build darwin || linux

package kernels

import "github.com/ebitengine/purego"

// openDriver opens the CUDA driver library (libcuda) with purego's dlopen.
func openDriver() (uintptr, error) {
	var err error
	for _, name := range []string{"libcuda.so.1", "libcuda.so"} {
		var lib uintptr
		if lib, err = purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			return lib, nil
		}
	}
	return 0, err
}

// driverSym is the address of the driver's function name.
func driverSym(lib uintptr, name string) (uintptr, error) { return purego.Dlsym(lib, name) }

// bindFunc makes *fn (a pointer to a func variable) call the C function at sym.
func bindFunc(fn any, sym uintptr) { purego.RegisterFunc(fn, sym) }
