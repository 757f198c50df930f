// Package defaultmodel holds Manifold's built-in model, so that cmd/generate
// runs with no download: a small DeepSeek-V4 (mHC residuals, compressed
// sparse attention, MoE; 8.4M parameters) trained on the Go standard
// library's sources, with its own byte-level BPE tokenizer, stored as NVFP4
// (8.8 MB, embedded with go:embed). docs/MODEL_CARD.md describes it;
// training/ holds the data preparation and the training script.
//
// The engine memory-maps weights, so it needs a real folder: Dir extracts the
// embedded files on first use into the user's cache folder, under a name
// derived from their content, and reuses that folder afterwards. Extraction
// writes into a temporary folder beside the target and renames it, so a
// concurrent or interrupted run never leaves a partial model where Dir looks.
//
// The package owns the embedded files and their extraction only: it does
// not load or run the model (the engine does) and holds no package-level
// mutable state.
package defaultmodel

import (
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
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

// ExtractTo returns root/<ID>, the folder holding the model's files,
// extracting them there unless a complete copy is already present.
func ExtractTo(root string) (string, error) {
	es, err := entries()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, id(es))
	if complete(dir, es) {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".extract-"+id(es)+"-")
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
	if _, err := os.Stat(dir); err == nil {
		// An incomplete copy (a file removed by hand, say): replace it.
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("defaultmodel: removing the incomplete %s: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Another process may have extracted the same files first.
		if complete(dir, es) {
			return dir, nil
		}
		return "", fmt.Errorf("defaultmodel: %w", err)
	}
	return dir, nil
}

// complete reports whether dir holds every file with its embedded size.
// Contents are not reread: the folder is only ever created by a rename of
// a fully written one, and its name is the contents' hash.
func complete(dir string, es []entry) bool {
	for _, e := range es {
		fi, err := os.Stat(filepath.Join(dir, e.name))
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != int64(len(e.data)) {
			return false
		}
	}
	return true
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
