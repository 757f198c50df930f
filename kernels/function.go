package kernels

import "github.com/manifoldlm/manifold/backend"

// function returns kernel name's handle: the core kernels are looked up by
// New; the others (the architecture ops of mhc.go, dsv4.go, dsa.go and
// htree.go) on first use, then cached. A kernel looked up here may use up to
// opsShare() bytes of dynamic shared memory. A failed lookup is kept for
// Sync and yields 0, which the launch then also reports.
func (b *Backend) function(name string) uintptr {
	f, err := b.lookup(name)
	if err != nil {
		b.setErr(err)
		return 0
	}
	return f
}

// lookup is function without recording a failure: the handle, cached, or
// the error of finding it or setting its attributes.
func (b *Backend) lookup(name string) (uintptr, error) {
	b.mu.Lock()
	f, ok := b.fn[name]
	b.mu.Unlock()
	if ok {
		return f, nil
	}
	return b.load(name)
}

// load looks kernel name up in the module and caches its handle (lookup's
// first call for a name: apart, so that the closure it runs on the context,
// which captures the handle, is not allocated on every lookup).
func (b *Backend) load(name string) (uintptr, error) {
	var f uintptr
	var err error
	b.d.onContext(b.ctx, func() {
		if err = b.d.check("cuModuleGetFunction "+name, b.d.cuModuleGetFunction(&f, b.module, cString(name))); err != nil {
			return
		}
		err = b.d.check("cuFuncSetAttribute "+name, b.d.cuFuncSetAttribute(f, 8, int32(b.opsShare())))
		if err == nil && name == "tkc_select16" { // clusters of 16 blocks
			err = b.d.check("cuFuncSetAttribute "+name, b.d.cuFuncSetAttribute(f, attrNonPortableCluster, 1))
		}
	})
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.fn[name] = f
	b.mu.Unlock()
	return f, nil
}

// attrNonPortableCluster is CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED.
const attrNonPortableCluster = 14

// opsShare is the dynamic shared memory a lazily looked-up kernel may use:
// the opt-in maximum less room for its static shared arrays (the radix
// histogram and reductions of dsa.cuh take under 9 KiB).
func (b *Backend) opsShare() int { return b.maxShare - 12288 }

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// optPtr is the device address of an optional buffer (0 for nil).
func optPtr(x backend.Buffer) uint64 {
	if x == nil {
		return 0
	}
	return ptr(x)
}

// weightArgs are the format code (0 f32, 1 bf16, 2 NVFP4, 3 FP8), data, scales and
// global scale of a weight, as the kernels' weight_at takes them.
func weightArgs(w *Weight) (format int, data, scales uint64, global float32) {
	data = w.data.ptr
	switch w.format {
	case backend.BF16:
		format = 1
	case backend.NVFP4:
		format, scales, global = 2, w.scales.ptr, w.global
	case backend.FP8Block:
		format, scales = fp8Format, w.scales.ptr // float32 tile scales (fp8.go)
	}
	return format, data, scales, global
}
