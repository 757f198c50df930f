package kernels

import (
	"fmt"
	"runtime"
)

// MeasureCopyBandwidth is CopyBandwidth's measurement with the buffer size
// chosen and errors returned, for tools (cmd/bench): the driver's
// device-to-device copy of bytes (rounded down to 4) from one buffer into
// another, queued 20 times after a warm-up between two CUDA events on the
// backend's stream, counting bytes read plus bytes written (2 × bytes per
// copy) per second of device time. An allocation that fails (the weights
// left too little memory) is returned as an error, and the backend's error
// state is left clear.
func (b *Backend) MeasureCopyBandwidth(bytes int) (float64, error) {
	bytes &^= 3
	if bytes <= 0 {
		return 0, fmt.Errorf("kernels: copy bandwidth over %d bytes", bytes)
	}
	if err := b.Sync(); err != nil { // an earlier error is not this measurement's
		return 0, err
	}
	src, err := b.alloc(bytes)
	if err != nil {
		return 0, err
	}
	dst, err := b.alloc(bytes)
	if err != nil {
		return 0, err
	}
	cp := func() { b.copyDriver(dst.ptr, src.ptr, bytes) } // the driver's copy, as CopyBandwidth's
	cp()                                                   // warm up
	d := deviceTime(b, 20, cp)
	err = b.Sync()
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("kernels: copy of %d bytes timed at %v", bytes, d)
	}
	return 2 * float64(bytes) / d.Seconds(), nil
}
