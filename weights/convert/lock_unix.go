//go:build unix

package convert

import (
	"os"

	"golang.org/x/sys/unix"
)

// lockFile takes an exclusive lock (flock) on f without waiting.
func lockFile(f *os.File) error {
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}

// tryLockFile takes the lock on f if no other open file holds it.
func tryLockFile(f *os.File) bool { return lockFile(f) == nil }

// locking says whether lockFile excludes other processes.
const locking = true
