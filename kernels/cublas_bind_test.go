//go:build linux

package kernels

import (
	"testing"

	"github.com/ebitengine/purego"
)

// TestCublasBindings binds every cuBLAS entry point's Go signature to some
// C function (libc's abs, never called): purego checks the argument types
// and count (cublasGemmEx's 19) when it binds, so a signature it cannot
// call fails here rather than at New on the device. No GPU needed.
func TestCublasBindings(t *testing.T) {
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skip(err)
	}
	sym, err := purego.Dlsym(libc, "abs")
	if err != nil {
		t.Skip(err)
	}
	var l cublasLib
	for _, fn := range []any{&l.create, &l.destroy, &l.setStream, &l.setWorkspace, &l.getVersion, &l.gemmEx} {
		bindFunc(fn, sym)
	}
	if l.gemmEx == nil || l.create == nil {
		t.Fatal("not bound")
	}
}
