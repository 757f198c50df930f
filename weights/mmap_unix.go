//go:build unix

package weights

import (
	"os"
	"syscall"
)

// mapFile maps size bytes of f read-only. The returned release func unmaps.
func mapFile(f *os.File, size int64) ([]byte, func() error, error) {
	if size == 0 {
		return nil, func() error { return nil }, nil
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return syscall.Munmap(b) }, nil
}

// openFlags are added to O_RDONLY when a checkpoint file is opened:
// O_NONBLOCK makes the open of a named pipe return at once (it would wait
// for a writer), so that openRegular can reject it; it does nothing to a
// regular file's reads, and mapFile's f.Fd() puts the descriptor back in
// blocking mode.
const openFlags = syscall.O_NONBLOCK
