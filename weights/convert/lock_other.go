//go:build !unix

package convert

import "os"

// lockFile does nothing where flock is unavailable.
func lockFile(f *os.File) error { return nil }

// tryLockFile fails where flock is unavailable: a leftover temporary
// folder cannot be told from a live conversion's, so none is removed
// (removeStale reports them).
func tryLockFile(f *os.File) bool { return false }

// locking says whether lockFile excludes other processes.
const locking = false
