package kernels

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Profiling brackets every kernel launch with CUDA events so that the time
// each kernel takes on the device can be summed by name. It costs two event
// records per launch, so it is off unless StartProfile is called.

type timedLaunch struct {
	name       string
	start, end uintptr
}

// StartProfile begins recording per-kernel device time.
// Queued operations are timed as the queue is launched, one by one (no
// graphs), so the times include any gaps between launches.
func (b *Backend) StartProfile() {
	b.onContext(func() {}) // what was queued before is not profiled
	b.qmu.Lock()
	b.profiling = true
	b.qmu.Unlock()
}

func (b *Backend) recordStart() uintptr {
	var ev uintptr
	b.d.cuEventCreate(&ev, 0)
	b.d.cuEventRecord(ev, b.stream)
	return ev
}

func (b *Backend) recordEnd(name string, start uintptr) {
	var ev uintptr
	b.d.cuEventCreate(&ev, 0)
	b.d.cuEventRecord(ev, b.stream)
	b.mu.Lock()
	b.timed = append(b.timed, timedLaunch{name, start, ev})
	b.mu.Unlock()
}

// KernelTime is the device time of one kernel name over a profile.
type KernelTime struct {
	Name     string
	Launches int
	Total    time.Duration
}

// StopProfile ends recording and returns the device time per kernel, largest first.
func (b *Backend) StopProfile() []KernelTime {
	b.onContext(func() {}) // time what is queued
	b.qmu.Lock()
	b.profiling = false
	b.qmu.Unlock()
	b.mu.Lock()
	timed := b.timed
	b.timed = nil
	b.mu.Unlock()
	sums := map[string]*KernelTime{}
	b.onContext(func() {
		b.d.cuStreamSynchronize(b.stream)
		for _, t := range timed {
			var ms float32
			b.d.cuEventElapsedTime(&ms, t.start, t.end)
			k := sums[t.name]
			if k == nil {
				k = &KernelTime{Name: t.name}
				sums[t.name] = k
			}
			k.Launches++
			k.Total += time.Duration(float64(ms) * 1e6)
			b.d.cuEventDestroy(t.start)
			b.d.cuEventDestroy(t.end)
		}
	})
	var out []KernelTime
	for _, k := range sums {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b KernelTime) int { return int(b.Total - a.Total) })
	return out
}

// FormatProfile renders a profile as a table with each kernel's share.
func FormatProfile(p []KernelTime) string {
	var total time.Duration
	for _, k := range p {
		total += k.Total
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-18s %9s %12s %7s\n", "kernel", "launches", "device time", "share")
	for _, k := range p {
		fmt.Fprintf(&sb, "%-18s %9d %12s %6.1f%%\n", k.Name, k.Launches, k.Total.Round(time.Microsecond), 100*float64(k.Total)/float64(total))
	}
	return sb.String()
}

// CopyBandwidth measures the device-to-device copy rate of a 1 GiB buffer,
// counting bytes read and written: the memory roofline for benchmarks.
func (b *Backend) CopyBandwidth() float64 {
	const n = 1 << 28
	src, dst := b.NewBuffer(n), b.NewBuffer(n)
	cp := func() { b.copyDriver(ptr(dst), ptr(src), 4*n) } // the driver's copy: the reference, not our kernel
	cp()                                                   // warm up
	d := deviceTime(b, 20, cp)
	return 2 * 4 * n / d.Seconds()
}

// deviceTime runs fn iters times between two CUDA events and returns the
// device time per run.
func deviceTime(b *Backend, iters int, fn func()) time.Duration {
	var start, end uintptr
	var ms float32
	b.onContext(func() {
		b.d.cuEventCreate(&start, 0)
		b.d.cuEventCreate(&end, 0)
		b.d.cuEventRecord(start, b.stream)
	})
	for range iters {
		fn()
	}
	b.onContext(func() {
		b.d.cuEventRecord(end, b.stream)
		b.d.cuEventSynchronize(end)
		b.d.cuEventElapsedTime(&ms, start, end)
		b.d.cuEventDestroy(start)
		b.d.cuEventDestroy(end)
	})
	return time.Duration(float64(ms) * 1e6 / float64(iters))
}
