//go:build unix

package cpu

import "syscall"

// processCPU is the process's user+system CPU time in seconds: benchmarks
// report rates per CPU-second too, which stay comparable on a machine
// other work shares (wall time does not).
func processCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
