//go:build darwin || linux

package kernels

import (
	"os"
	"path/filepath"
	"sort"

	"github.com/ebitengine/purego"
)

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

// cublasCandidates are the libcublas files openCublas tries, in order: for
// CUDA 13, then 12, the soname the dynamic loader resolves (its cache,
// LD_LIBRARY_PATH) and then absolute paths where CUDA toolkits and
// PyTorch's NVIDIA wheels put it (nvidia/cu13/lib for CUDA 13's wheels,
// nvidia/cublas/lib for CUDA 12's; newest directory first); last the
// unversioned libcublas.so (a development link, maybe to an older one).
// Each absolute path is paired with its libcublasLt, loaded first by
// absolute path so that libcublas's dependency on it resolves without the
// loader's search path.
func cublasCandidates() [][2]string {
	var dirs []string
	for _, pat := range []string{
		"/usr/local/lib/python3*/dist-packages/nvidia/cu13/lib", "/usr/local/lib/python3*/site-packages/nvidia/cu13/lib",
		"/usr/lib/python3*/dist-packages/nvidia/cu13/lib", "/opt/conda/lib/python3*/site-packages/nvidia/cu13/lib",
		"/usr/local/lib/python3*/dist-packages/nvidia/cublas/lib", "/usr/local/lib/python3*/site-packages/nvidia/cublas/lib",
		"/usr/lib/python3*/dist-packages/nvidia/cublas/lib", "/opt/conda/lib/python3*/site-packages/nvidia/cublas/lib",
		"/usr/local/cuda/lib64", "/usr/local/cuda-*/lib64", "/usr/local/cuda/targets/*/lib", "/usr/local/cuda-*/targets/*/lib",
	} {
		m, _ := filepath.Glob(pat)
		sort.Sort(sort.Reverse(sort.StringSlice(m))) // newest version first
		dirs = append(dirs, m...)
	}
	var out [][2]string
	for _, v := range []string{"13", "12"} {
		out = append(out, [2]string{"", "libcublas.so." + v})
		for _, d := range dirs {
			lib := filepath.Join(d, "libcublas.so."+v)
			if _, err := os.Stat(lib); err == nil {
				out = append(out, [2]string{filepath.Join(d, "libcublasLt.so."+v), lib})
			}
		}
	}
	return append(out, [2]string{"", "libcublas.so"})
}

// openCublas opens libcublas (see cublasCandidates) and says which file.
func openCublas() (uintptr, string, error) {
	var err error
	for _, c := range cublasCandidates() {
		if c[0] != "" {
			if _, e := os.Stat(c[0]); e == nil {
				purego.Dlopen(c[0], purego.RTLD_NOW|purego.RTLD_GLOBAL) // a failure shows in libcublas's own
			}
		}
		var lib uintptr
		if lib, err = purego.Dlopen(c[1], purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			return lib, c[1], nil
		}
	}
	return 0, "", err
}
