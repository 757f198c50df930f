package kernels

import (
	"sync"
	"testing"
	"unsafe"
)

// fakeDriver stands in for libcuda where there is no GPU: it hands out
// addresses and handles, runs nothing, and counts what the backend asks of
// the driver, so that a test can see what a model's step queues and where
// the host waits (the launches, the host round trips, the allocations and
// whether the step's queue repeats and is replayed as a graph). Reads
// return zeros. It is not a simulation: no kernel computes, so a model's
// values are meaningless and only the shape of its work counts.
type fakeDriver struct {
	mu       sync.Mutex
	next     uint64             // the next device address (bump allocation)
	names    map[uintptr]string // kernel handles' names
	handles  map[string]uintptr
	handle   uintptr // the last handle given out (functions, events, graphs)
	host     [][]byte
	busy     bool   // cuStreamQuery's answer: work in flight
	capture  bool   // between cuStreamBeginCapture and cuStreamEndCapture
	onSend   func() // called at each cuMemcpyHtoDAsync (the queue's step values: sendDyn)
	onLaunch func(name string)

	counts fakeCounts
}

// fakeCounts is what the driver was asked, since the last reset.
type fakeCounts struct {
	launches      int            // kernels launched (not captured)
	byName        map[string]int // ... by kernel name
	copies        int            // device-to-device copies launched
	memsets       int            // cuMemsetD32Async calls
	allocs, frees int            // cuMemAlloc, cuMemFree
	syncs         int            // host waits: cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize, cuMemcpyDtoH
	sends         int            // host-to-device copies (step values, uploads)
	captured      int            // kernels captured into graphs
	captures      int            // graphs captured
	graphLaunches int            // cuGraphLaunch calls
}

func (f *fakeDriver) reset() {
	f.mu.Lock()
	f.counts = fakeCounts{byName: map[string]int{}}
	f.mu.Unlock()
}

func (f *fakeDriver) snapshot() fakeCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.counts
	c.byName = map[string]int{}
	for k, v := range f.counts.byName {
		c.byName[k] = v
	}
	return c
}

func (f *fakeDriver) newHandle() uintptr {
	f.handle += 16
	return f.handle
}

func (f *fakeDriver) launch(fn uintptr) int32 {
	f.mu.Lock()
	name := f.names[fn]
	if f.capture {
		f.counts.captured++
	} else {
		f.counts.launches++
		f.counts.byName[name]++
	}
	cb := f.onLaunch
	f.mu.Unlock()
	if cb != nil {
		cb(name)
	}
	return 0
}

// newFakeDriver returns a driver of one H100-like GPU (132 multiprocessors,
// 227 KB of shared memory a block).
func newFakeDriver() (*driver, *fakeDriver) {
	f := &fakeDriver{next: 1 << 40, names: map[uintptr]string{}, handles: map[string]uintptr{}, handle: 1 << 20}
	f.reset()
	errStr := []byte("fake error\x00")
	d := &driver{
		cuInit:           func(uint32) int32 { return 0 },
		cuDeviceGet:      func(dev *int32, ordinal int32) int32 { *dev = ordinal; return 0 },
		cuDeviceGetCount: func(n *int32) int32 { *n = 1; return 0 },
		cuDeviceGetName: func(name *byte, n int32, _ int32) int32 {
			copy(unsafe.Slice(name, n), "fake H100\x00")
			return 0
		},
		cuDeviceGetAttribute: func(v *int32, attr int32, _ int32) int32 {
			switch attr {
			case 16:
				*v = 132
			case 97:
				*v = 232448
			default:
				*v = 0
			}
			return 0
		},
		cuDevicePrimaryCtxRetain:  func(ctx *uintptr, _ int32) int32 { *ctx = 1; return 0 },
		cuDevicePrimaryCtxRelease: func(int32) int32 { return 0 },
		cuCtxSetCurrent:           func(uintptr) int32 { return 0 },
		cuCtxSynchronize:          func() int32 { f.mu.Lock(); f.counts.syncs++; f.mu.Unlock(); return 0 },
		cuModuleLoadData:          func(mod *uintptr, _ unsafe.Pointer) int32 { *mod = 2; return 0 },
		cuModuleGetFunction: func(fn *uintptr, _ uintptr, name *byte) int32 {
			f.mu.Lock()
			defer f.mu.Unlock()
			s := goString(name)
			h, seen := f.handles[s]
			if !seen {
				h = f.newHandle()
				f.handles[s], f.names[h] = h, s
			}
			*fn = h
			return 0
		},
		cuModuleUnload:     func(uintptr) int32 { return 0 },
		cuFuncSetAttribute: func(uintptr, int32, int32) int32 { return 0 },
		cuMemAlloc: func(p *uint64, size uintptr) int32 {
			f.mu.Lock()
			defer f.mu.Unlock()
			*p = f.next
			f.next += (uint64(size) + 511) &^ 511
			f.counts.allocs++
			return 0
		},
		cuMemFree: func(uint64) int32 { f.mu.Lock(); f.counts.frees++; f.mu.Unlock(); return 0 },
		cuMemGetInfo: func(free, total *uintptr) int32 {
			*free, *total = 79<<30, 80<<30
			return 0
		},
		cuMemcpyHtoD: func(uint64, unsafe.Pointer, uintptr) int32 { f.mu.Lock(); f.counts.sends++; f.mu.Unlock(); return 0 },
		cuMemcpyDtoH: func(dst unsafe.Pointer, _ uint64, n uintptr) int32 {
			clear(unsafe.Slice((*byte)(dst), n))
			f.mu.Lock()
			f.counts.syncs++
			f.mu.Unlock()
			return 0
		},
		cuMemcpyDtoHAsync: func(dst unsafe.Pointer, _ uint64, n uintptr, _ uintptr) int32 {
			clear(unsafe.Slice((*byte)(dst), n))
			return 0
		},
		cuMemAllocHost: func(p *unsafe.Pointer, n uintptr) int32 {
			buf := make([]byte, n)
			f.mu.Lock()
			f.host = append(f.host, buf)
			f.mu.Unlock()
			*p = unsafe.Pointer(&buf[0])
			return 0
		},
		cuMemFreeHost:     func(unsafe.Pointer) int32 { return 0 },
		cuMemcpyDtoDAsync: func(uint64, uint64, uintptr, uintptr) int32 { f.mu.Lock(); f.counts.copies++; f.mu.Unlock(); return 0 },
		cuMemsetD32Async:  func(uint64, uint32, uintptr, uintptr) int32 { f.mu.Lock(); f.counts.memsets++; f.mu.Unlock(); return 0 },
		cuLaunchKernel: func(fn uintptr, _, _, _, _, _, _, _ uint32, _ uintptr, _, _ unsafe.Pointer) int32 {
			return f.launch(fn)
		},
		cuStreamCreate:      func(s *uintptr, _ uint32) int32 { *s = 3; return 0 },
		cuStreamDestroy:     func(uintptr) int32 { return 0 },
		cuStreamSynchronize: func(uintptr) int32 { f.mu.Lock(); f.counts.syncs++; f.mu.Unlock(); return 0 },
		cuStreamQuery: func(uintptr) int32 {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.busy {
				return cudaErrorNotReady
			}
			return 0
		},
		cuGetErrorString: func(_ int32, s **byte) int32 { *s = &errStr[0]; return 0 },
		cuEventCreate: func(ev *uintptr, _ uint32) int32 {
			f.mu.Lock()
			*ev = f.newHandle()
			f.mu.Unlock()
			return 0
		},
		cuEventRecord:      func(uintptr, uintptr) int32 { return 0 },
		cuEventSynchronize: func(uintptr) int32 { f.mu.Lock(); f.counts.syncs++; f.mu.Unlock(); return 0 },
		cuEventElapsedTime: func(ms *float32, _, _ uintptr) int32 { *ms = 0; return 0 },
		cuEventDestroy:     func(uintptr) int32 { return 0 },
		cuMemcpyHtoDAsync: func(uint64, unsafe.Pointer, uintptr, uintptr) int32 {
			f.mu.Lock()
			f.counts.sends++
			cb := f.onSend
			f.mu.Unlock()
			if cb != nil {
				cb()
			}
			return 0
		},
		cuStreamBeginCapture: func(uintptr, int32) int32 { f.mu.Lock(); f.capture = true; f.mu.Unlock(); return 0 },
		cuStreamEndCapture: func(_ uintptr, g *uintptr) int32 {
			f.mu.Lock()
			f.capture = false
			f.counts.captures++
			*g = f.newHandle()
			f.mu.Unlock()
			return 0
		},
		cuGraphInstantiateWithFlags: func(exec *uintptr, _ uintptr, _ uint64) int32 {
			f.mu.Lock()
			*exec = f.newHandle()
			f.mu.Unlock()
			return 0
		},
		cuGraphLaunch:      func(uintptr, uintptr) int32 { f.mu.Lock(); f.counts.graphLaunches++; f.mu.Unlock(); return 0 },
		cuGraphExecDestroy: func(uintptr) int32 { return 0 },
		cuGraphDestroy:     func(uintptr) int32 { return 0 },
		cuLaunchKernelEx: func(_ unsafe.Pointer, fn uintptr, _, _ unsafe.Pointer) int32 {
			return f.launch(fn)
		},
	}
	return d, f
}

// newFakeGPU is a Backend on a fakeDriver, with o's settings (cuBLAS off:
// no libcublas is loaded for a fake device).
func newFakeGPU(t testing.TB, o Options) (*Backend, *fakeDriver) {
	t.Helper()
	d, f := newFakeDriver()
	o.NoCuBLAS = true
	b, err := newOn(d, 0, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, f
}
