//go:build !unix

package defaultmodel

import "time"

// locking is false where flock is unavailable: concurrent extractions then
// rely on the atomic rename alone, and temporary folders left by killed
// processes are ignored (never removed, since they cannot be told from live
// ones).
const locking = false

func lock(path string, wait time.Duration) (unlock func(), err error) { return func() {}, nil }

func tryLock(path string) (unlock func(), ok bool) { return nil, false }
