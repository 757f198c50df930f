// Package defaultmodel holds Manifold's built-in model, so that cmd/generate
// runs with no download: a small DeepSeek-V4 (mHC residuals, compressed
// sparse attention, MoE; 8.4M parameters) trained on the Go standard
// library's sources, with its own byte-level BPE tokenizer, stored as NVFP4
// (8.8 MB, embedded with go:embed). docs/MODEL_CARD.md describes it;
// training/ holds the data preparation and the training script.
//
// The engine memory-maps weights, so it needs a real folder: Dir extracts the
// embedded files on first use into the user's cache folder, under a name
// derived from their content, and reuses that folder afterwards once it has
// checked it byte for byte. Extraction writes into a temporary folder beside
// the target and renames it, under a lock file, so that concurrent runs in
// several processes never remove or see a partial model where Dir looks, and
// a killed run's leftovers are removed by a later one (ExtractTo).
//
// The package owns the embedded files and their extraction only: it does
// not load or run the model (the engine does) and holds no package-level
// mutable state.
package defaultmodel

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

//go:embed nvfp4
var files embed.FS

// embedRoot is the folder of files that holds the model.
const embedRoot = "nvfp4"

type entry struct {
	name string
	data []byte
}

// entries reads the embedded files, sorted by name (as fs.ReadDir returns them).
func entries() ([]entry, error) {
	des, err := fs.ReadDir(files, embedRoot)
	if err != nil {
		return nil, err
	}
	var out []entry
	for _, de := range des {
		if de.IsDir() {
			return nil, fmt.Errorf("defaultmodel: unexpected folder %s in the embedded model", de.Name())
		}
		b, err := files.ReadFile(path.Join(embedRoot, de.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, entry{de.Name(), b})
	}
	return out, nil
}

// ID is the first 16 hex digits of the SHA-256 of the embedded files (names,
// lengths and contents, in name order): the name of the extracted folder.
func ID() (string, error) {
	es, err := entries()
	if err != nil {
		return "", err
	}
	return id(es), nil
}

func id(es []entry) string {
	h := sha256.New()
	var n [8]byte
	for _, e := range es {
		binary.LittleEndian.PutUint64(n[:], uint64(len(e.name)))
		h.Write(n[:])
		h.Write([]byte(e.name))
		binary.LittleEndian.PutUint64(n[:], uint64(len(e.data)))
		h.Write(n[:])
		h.Write(e.data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Dir returns the folder of the extracted model, extracting it first if
// needed, below os.UserCacheDir()/manifold (os.TempDir()/manifold when the
// system has no user cache folder).
func Dir() (string, error) {
	root, err := os.UserCacheDir()
	if err != nil {
		root = os.TempDir()
	}
	return ExtractTo(filepath.Join(root, "manifold"))
}

// lockWait is how long an extraction waits for another process's.
const lockWait = time.Minute

// ExtractTo returns root/<ID>, the folder holding the model's files,
// extracting them there unless a complete copy is already present.
//
// It is safe for any number of processes at once. A copy is complete when
// every file equals the embedded one, byte for byte (read back each time:
// 9 MB, a few milliseconds). Otherwise the process takes an exclusive lock,
// root/.<ID>.lock (flock, released by the kernel however its holder ends),
// looks again, and extracts into a new temporary folder beside the target,
// root/.extract-<ID>-*, which it renames to root/<ID>. A damaged copy (a
// file removed or changed by hand) is first renamed aside, so no process
// ever finds a partial folder under the published name. Temporary folders
// of killed extractions are removed by the next run that takes the lock.
func ExtractTo(root string) (string, error) {
	return extract(root, extractOptions{lockWait: lockWait})
}

type extractOptions struct {
	lockWait time.Duration
	// beforePublish, when set (tests), runs with the temporary folder
	// written and the lock held, before the folder is renamed.
	beforePublish func(tmp string)
}

func lockName(id string) string    { return "." + id + ".lock" }
func tempPrefix(id string) string  { return ".extract-" + id + "-" }
func asidePrefix(id string) string { return ".damaged-" + id + "-" }

func extract(root string, o extractOptions) (string, error) {
	es, err := entries()
	if err != nil {
		return "", err
	}
	id := id(es)
	dir := filepath.Join(root, id)
	damage, err := check(dir, es)
	if err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	if damage == "" {
		removeLeftovers(root, id, false)
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	unlock, err := lock(filepath.Join(root, lockName(id)), o.lockWait)
	if err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	defer unlock()
	// Another process may have published a copy while this one waited.
	if damage, err = check(dir, es); err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	removeLeftovers(root, id, true)
	if damage == "" {
		return dir, nil
	}

	tmp, err := os.MkdirTemp(root, tempPrefix(id))
	if err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	for _, e := range es {
		if err := writeFile(filepath.Join(tmp, e.name), e.data); err != nil {
			return "", fmt.Errorf("defaultmodel: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	if o.beforePublish != nil {
		o.beforePublish(tmp)
	}
	if _, err := os.Lstat(dir); err == nil && locking {
		// A damaged copy: move it out of the way, then remove it. No process
		// opens files under the new name, and those that hold the old files
		// open or mapped keep reading them. (Without a lock, the copy may be
		// another process's, published since the check: it is left alone.)
		aside := filepath.Join(root, fmt.Sprintf("%s%d-%d", asidePrefix(id), os.Getpid(), time.Now().UnixNano()))
		if err := os.Rename(dir, aside); err != nil {
			return "", fmt.Errorf("defaultmodel: moving aside the damaged %s (%s): %w", dir, damage, err)
		}
		defer os.RemoveAll(aside)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Without a lock, another process may have published first.
		if d, cerr := check(dir, es); cerr == nil && d == "" {
			return dir, nil
		}
		if _, lerr := os.Lstat(dir); lerr == nil {
			return "", fmt.Errorf("defaultmodel: %w (the copy there is damaged: %s; remove it)", err, damage)
		}
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	return dir, nil
}

// removeLeftovers removes the temporary and set-aside folders of
// extractions of id that were killed before they finished. Only a process
// holding the lock may remove them (every live extraction holds it while
// its temporary folder exists): with locked false, removeLeftovers takes it
// if it is free and does nothing otherwise. Errors are ignored: a leftover
// is only wasted space.
func removeLeftovers(root, id string, locked bool) {
	if !locking {
		return
	}
	des, err := os.ReadDir(root)
	if err != nil {
		return
	}
	var left []string
	for _, de := range des {
		if n := de.Name(); strings.HasPrefix(n, tempPrefix(id)) || strings.HasPrefix(n, asidePrefix(id)) {
			left = append(left, filepath.Join(root, n))
		}
	}
	if len(left) == 0 {
		return
	}
	if !locked {
		unlock, ok := tryLock(filepath.Join(root, lockName(id)))
		if !ok {
			return
		}
		defer unlock()
	}
	for _, p := range left {
		os.RemoveAll(p)
	}
}

// check compares dir with the embedded files, byte for byte. It returns ""
// for a complete copy, else what is wrong with it (the folder or a file
// missing, a size or content differing); err reports a failure to read
// that says nothing about the copy (permissions, say), which must not be
// taken for damage.
func check(dir string, es []entry) (damage string, err error) {
	buf := make([]byte, 1<<16)
	for _, e := range es {
		name := filepath.Join(dir, e.name)
		f, err := os.Open(name)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return name + " is missing", nil
		} else if err != nil {
			return "", err
		}
		d, err := sameContent(f, e.data, buf)
		f.Close()
		if d != "" || err != nil {
			return name + " " + d, err
		}
	}
	return "", nil
}

// sameContent compares the open file f with want.
func sameContent(f *os.File, want, buf []byte) (damage string, err error) {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return "", err
	case !fi.Mode().IsRegular():
		return "is not a regular file", nil
	case fi.Size() != int64(len(want)):
		return fmt.Sprintf("holds %d bytes, not %d", fi.Size(), len(want)), nil
	}
	for off := 0; off < len(want); {
		n, err := f.Read(buf[:min(len(buf), len(want)-off)])
		if !bytes.Equal(buf[:n], want[off:off+n]) {
			return "differs from the embedded file", nil
		}
		off += n
		if err == io.EOF && off < len(want) {
			return "is shorter than it was", nil
		} else if err != nil && err != io.EOF {
			return "", err
		}
	}
	return "", nil
}

func writeFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	return errors.Join(werr, serr, cerr)
}
