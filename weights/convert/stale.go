package convert

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// A conversion writes into a temporary folder beside the output,
// .NAME.tmp-*, holding an exclusive lock (flock) on the file lockName
// inside it until the folder is renamed or removed. A process killed with
// SIGKILL (or by the kernel's out-of-memory killer) removes nothing, but the
// kernel releases its lock; a later conversion to the same output name
// finds the folder with its lock free and removes it.
const lockName = ".convert.lock"

func tempPrefix(out string) string { return "." + filepath.Base(filepath.Clean(out)) + ".tmp-" }

// makeTemp creates the temporary folder for out in parent and takes its
// lock. The lock file is created under another name and renamed into place
// once locked, so that a lock file found under lockName is held from its
// first instant. unlock releases it; call it after the folder is renamed
// or removed.
func makeTemp(parent, out string) (tmp string, unlock func(), err error) {
	tmp, err = os.MkdirTemp(parent, tempPrefix(out))
	if err != nil {
		return "", nil, err
	}
	f, err := os.OpenFile(filepath.Join(tmp, lockName+".new"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		if err = lockFile(f); err == nil {
			err = os.Rename(f.Name(), filepath.Join(tmp, lockName))
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("locking the temporary folder %s: %w", tmp, err)
	}
	return tmp, func() { f.Close() }, nil
}

// removeStale removes the temporary folders that earlier conversions to out
// (in parent) left when they were killed: those whose lock no process holds.
// It leaves those whose lock is held (a conversion to the same name running
// now) and those without a lock file, which it cannot tell from a live
// conversion (one by an earlier version of this package, or one killed in
// the instant between creating its folder and its lock): it returns them
// for the caller to report. Each folder removed or left is also reported on
// w when w is not nil.
func removeStale(parent, out string, w io.Writer) (removed, left []string) {
	des, err := os.ReadDir(parent)
	if err != nil {
		return nil, nil
	}
	prefix := tempPrefix(out)
	for _, de := range des {
		if !de.IsDir() || !strings.HasPrefix(de.Name(), prefix) {
			continue
		}
		dir := filepath.Join(parent, de.Name())
		switch stale, err := lockFree(dir); {
		case errors.Is(err, fs.ErrNotExist) || !locking:
			if _, err := os.Stat(dir); err != nil {
				continue // published or removed meanwhile
			}
			left = append(left, dir)
			if w != nil {
				fmt.Fprintf(w, "convert: %s looks like what an interrupted conversion left, but holds no %s to tell; remove it if no conversion to %s is running\n",
					dir, lockName, out)
			}
		case err != nil || !stale:
		default:
			removed = append(removed, dir)
			if w != nil {
				fmt.Fprintf(w, "convert: removed %s, left by a conversion that was killed\n", dir)
			}
		}
	}
	return removed, left
}

// lockFree reports whether no process holds the lock of the temporary
// folder dir, and if so removes dir while holding the lock itself. The
// lock file must still be the one it locked: a conversion that published
// dir removed its lock file first, then renamed dir, then released the
// lock.
func lockFree(dir string) (bool, error) {
	name := filepath.Join(dir, lockName)
	f, err := os.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if !tryLockFile(f) {
		return false, nil
	}
	held, err1 := f.Stat()
	now, err2 := os.Stat(name)
	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		return false, nil
	}
	return true, os.RemoveAll(dir)
}
