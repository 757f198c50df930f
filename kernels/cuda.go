package kernels

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// driver holds the CUDA driver API entry points, resolved from libcuda at run
// time with purego: no cgo and no CUDA headers at build time.
type driver struct {
	cuInit                    func(flags uint32) int32
	cuDeviceGet               func(dev *int32, ordinal int32) int32
	cuDeviceGetCount          func(n *int32) int32
	cuDeviceGetName           func(name *byte, n int32, dev int32) int32
	cuDeviceGetAttribute      func(v *int32, attr int32, dev int32) int32
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) int32
	cuDevicePrimaryCtxRelease func(dev int32) int32
	cuCtxSetCurrent           func(ctx uintptr) int32
	cuCtxSynchronize          func() int32
	cuModuleLoadData          func(mod *uintptr, image unsafe.Pointer) int32
	cuModuleGetFunction       func(fn *uintptr, mod uintptr, name *byte) int32
	cuModuleUnload            func(mod uintptr) int32
	cuFuncSetAttribute        func(fn uintptr, attr int32, v int32) int32
	cuMemAlloc                func(ptr *uint64, size uintptr) int32
	cuMemFree                 func(ptr uint64) int32
	cuMemGetInfo              func(free, total *uintptr) int32
	cuMemcpyHtoD              func(dst uint64, src unsafe.Pointer, n uintptr) int32
	cuMemcpyDtoH              func(dst unsafe.Pointer, src uint64, n uintptr) int32
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, n uintptr, stream uintptr) int32
	cuMemAllocHost            func(p *unsafe.Pointer, n uintptr) int32
	cuMemFreeHost             func(p unsafe.Pointer) int32
	cuMemcpyDtoDAsync         func(dst, src uint64, n uintptr, stream uintptr) int32
	cuMemsetD32Async          func(dst uint64, v uint32, n uintptr, stream uintptr) int32
	cuLaunchKernel            func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) int32
	cuStreamCreate            func(stream *uintptr, flags uint32) int32
	cuStreamDestroy           func(stream uintptr) int32
	cuStreamSynchronize       func(stream uintptr) int32
	cuStreamQuery             func(stream uintptr) int32
	cuGetErrorString          func(err int32, s **byte) int32
	cuEventCreate             func(ev *uintptr, flags uint32) int32
	cuEventRecord             func(ev, stream uintptr) int32
	cuEventSynchronize        func(ev uintptr) int32
	cuEventElapsedTime        func(ms *float32, start, end uintptr) int32
	cuEventDestroy            func(ev uintptr) int32

	cuMemcpyHtoDAsync           func(dst uint64, src unsafe.Pointer, n uintptr, stream uintptr) int32
	cuStreamBeginCapture        func(stream uintptr, mode int32) int32
	cuStreamEndCapture          func(stream uintptr, graph *uintptr) int32
	cuGraphInstantiateWithFlags func(exec *uintptr, graph uintptr, flags uint64) int32
	cuGraphLaunch               func(exec, stream uintptr) int32
	cuGraphExecDestroy          func(exec uintptr) int32
	cuGraphDestroy              func(graph uintptr) int32
	cuLaunchKernelEx            func(config unsafe.Pointer, fn uintptr, params, extra unsafe.Pointer) int32

	cuOccupancyMaxActiveClusters func(n *int32, fn uintptr, config unsafe.Pointer) int32 // optional: nil if libcuda lacks it
	// optional (CUDA 12 drivers): nil if libcuda lacks it
	cuTensorMapEncodeTiled func(m unsafe.Pointer, dtype, rank uint32, addr uint64, dims, strides, box, elemStrides unsafe.Pointer,
		interleave, swizzle, l2promotion, oobFill uint32) int32
}

// ErrNoDriver is returned when libcuda cannot be loaded or finds no GPU.
var ErrNoDriver = errors.New("no CUDA driver or GPU")

var loadDriver = sync.OnceValues(func() (*driver, error) {
	lib, err := openDriver()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDriver, err)
	}
	d := &driver{}
	for _, f := range []struct {
		fn   any
		name string
	}{
		{&d.cuInit, "cuInit"}, {&d.cuDeviceGet, "cuDeviceGet"}, {&d.cuDeviceGetCount, "cuDeviceGetCount"},
		{&d.cuDeviceGetName, "cuDeviceGetName"}, {&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxSetCurrent, "cuCtxSetCurrent"}, {&d.cuCtxSynchronize, "cuCtxSynchronize"},
		{&d.cuModuleLoadData, "cuModuleLoadData"}, {&d.cuModuleGetFunction, "cuModuleGetFunction"},
		{&d.cuModuleUnload, "cuModuleUnload"}, {&d.cuFuncSetAttribute, "cuFuncSetAttribute"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"}, {&d.cuMemFree, "cuMemFree_v2"}, {&d.cuMemGetInfo, "cuMemGetInfo_v2"},
		{&d.cuMemcpyHtoD, "cuMemcpyHtoD_v2"}, {&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"}, {&d.cuMemAllocHost, "cuMemAllocHost_v2"},
		{&d.cuMemFreeHost, "cuMemFreeHost"},
		{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"}, {&d.cuMemsetD32Async, "cuMemsetD32Async"},
		{&d.cuLaunchKernel, "cuLaunchKernel"}, {&d.cuStreamCreate, "cuStreamCreate"},
		{&d.cuStreamDestroy, "cuStreamDestroy_v2"}, {&d.cuStreamSynchronize, "cuStreamSynchronize"}, {&d.cuStreamQuery, "cuStreamQuery"},
		{&d.cuGetErrorString, "cuGetErrorString"}, {&d.cuEventCreate, "cuEventCreate"},
		{&d.cuEventRecord, "cuEventRecord"}, {&d.cuEventSynchronize, "cuEventSynchronize"},
		{&d.cuEventElapsedTime, "cuEventElapsedTime"}, {&d.cuEventDestroy, "cuEventDestroy_v2"},
		{&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"}, {&d.cuStreamBeginCapture, "cuStreamBeginCapture_v2"},
		{&d.cuStreamEndCapture, "cuStreamEndCapture"}, {&d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"},
		{&d.cuGraphLaunch, "cuGraphLaunch"}, {&d.cuGraphExecDestroy, "cuGraphExecDestroy"},
		{&d.cuGraphDestroy, "cuGraphDestroy"}, {&d.cuLaunchKernelEx, "cuLaunchKernelEx"},
	} {
		sym, err := driverSym(lib, f.name)
		if err != nil {
			return nil, fmt.Errorf("%w: libcuda lacks %s: %v", ErrNoDriver, f.name, err)
		}
		bindFunc(f.fn, sym)
	}
	if sym, err := driverSym(lib, "cuOccupancyMaxActiveClusters"); err == nil {
		bindFunc(&d.cuOccupancyMaxActiveClusters, sym)
	}
	if sym, err := driverSym(lib, "cuTensorMapEncodeTiled"); err == nil {
		bindFunc(&d.cuTensorMapEncodeTiled, sym)
	}
	if r := d.cuInit(0); r != 0 {
		return nil, fmt.Errorf("%w: cuInit: %s", ErrNoDriver, d.errString(r))
	}
	return d, nil
})

func (d *driver) errString(r int32) string {
	var s *byte
	if d.cuGetErrorString(r, &s) != 0 || s == nil {
		return fmt.Sprintf("CUDA error %d", r)
	}
	return fmt.Sprintf("%s (CUDA error %d)", goString(s), r)
}

func (d *driver) check(what string, r int32) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("kernels: %s: %s", what, d.errString(r))
}

func goString(p *byte) string {
	var b []byte
	for ; *p != 0; p = (*byte)(unsafe.Add(unsafe.Pointer(p), 1)) {
		b = append(b, *p)
	}
	return string(b)
}

func cString(s string) *byte {
	b := append([]byte(s), 0)
	return &b[0]
}

// onContext runs fn on an OS thread whose current context is ctx: the driver
// keeps the current context per thread, and goroutines move between threads.
// Backend code calls Backend.onContext instead, which first launches the
// backend's queued work (queue.go).
func (d *driver) onContext(ctx uintptr, fn func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d.cuCtxSetCurrent(ctx)
	fn()
}
