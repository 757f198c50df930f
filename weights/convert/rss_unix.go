//go:build linux || darwin || freebsd

package convert

import (
	"runtime"
	"syscall"
)

// maxRSS returns the process's peak resident set size in bytes.
func maxRSS() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	if runtime.GOOS == "darwin" {
		return int64(ru.Maxrss) // bytes on darwin
	}
	return int64(ru.Maxrss) * 1024 // kilobytes elsewhere
}
