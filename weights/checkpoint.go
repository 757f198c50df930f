package weights

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// Standard file names of a Hugging Face checkpoint directory.
const (
	SingleFileName = "model.safetensors"
	IndexFileName  = "model.safetensors.index.json"
)

// Checkpoint is an open safetensors checkpoint: one file or several shards.
type Checkpoint struct {
	path     string // what Open was given
	dir      string
	files    []*mappedFile
	tensors  map[string]tensorRef
	names    []string // sorted
	metadata map[string]string

	mu     sync.RWMutex
	closed bool
}

type tensorRef struct {
	file *mappedFile
	info *tensorInfo
}

// mappedFile is one safetensors file, memory-mapped (or read into memory
// with OpenOptions.Copy), and its parsed header.
type mappedFile struct {
	path    string
	data    []byte // the whole file
	release func() error
	hdr     *header
}

// OpenOptions configure OpenWith. The zero value is Open's behaviour.
type OpenOptions struct {
	// Copy reads every file into memory at open instead of mapping it, so
	// that the checkpoint no longer depends on its files: one truncated or
	// rewritten in place while open changes nothing, where a mapping would
	// see the new bytes or kill the process with SIGBUS (see the package
	// comment). It costs the read at open (the files' size at the disk's
	// or the page cache's speed) and keeps the checkpoint's size resident
	// in private memory until Close, memory the kernel cannot reclaim or
	// share with other processes as it does mapped pages.
	Copy bool
}

// Open opens a checkpoint. path is a .safetensors file, a shard index
// (a *.index.json file), or a directory holding
// model.safetensors.index.json (sharded), model.safetensors, or a single
// *.safetensors file. Every header is parsed and validated; tensor data is
// memory-mapped and read only when used.
func Open(path string) (*Checkpoint, error) { return OpenWith(path, OpenOptions{}) }

// OpenWith opens a checkpoint as Open does, with options.
func OpenWith(path string, o OpenOptions) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	if !st.IsDir() {
		if strings.HasSuffix(path, ".index.json") {
			return openIndex(path, path, o)
		}
		return openFiles(path, filepath.Dir(path), []string{path}, o)
	}
	index := filepath.Join(path, IndexFileName)
	if _, err := os.Stat(index); err == nil {
		return openIndex(path, index, o)
	}
	single := filepath.Join(path, SingleFileName)
	if _, err := os.Stat(single); err == nil {
		return openFiles(path, path, []string{single}, o)
	}
	matches, err := filepath.Glob(filepath.Join(path, "*.safetensors"))
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	switch len(matches) {
	case 1:
		return openFiles(path, path, matches, o)
	case 0:
		return nil, errf(path, "", ErrNoCheckpoint, "directory has no %s, %s or *.safetensors", IndexFileName, SingleFileName)
	default:
		return nil, errf(path, "", ErrNoCheckpoint, "directory has %d *.safetensors files but no %s to say how they combine",
			len(matches), IndexFileName)
	}
}

type shardIndex struct {
	WeightMap map[string]string `json:"weight_map"`
}

func openIndex(path, index string, o OpenOptions) (*Checkpoint, error) {
	f, err := openRegular(index)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return nil, &Error{File: index, Err: err}
	}
	// Reject duplicate top-level keys and non-objects before decoding.
	if err := decodeObject(raw, skipValue); err != nil {
		return nil, errf(index, "", ErrBadIndex, "%v", err)
	}
	var idx shardIndex
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, errf(index, "", ErrBadIndex, "%v", err)
	}
	if idx.WeightMap == nil {
		return nil, errf(index, "", ErrBadIndex, "no weight_map")
	}
	dir := filepath.Dir(index)
	seen := make(map[string]bool)
	var shards []string
	for name, shard := range idx.WeightMap {
		if !filepath.IsLocal(shard) {
			return nil, errf(index, name, ErrBadIndex, "shard file %q is not a path inside %s", shard, dir)
		}
		if !seen[shard] {
			seen[shard] = true
			shards = append(shards, shard)
		}
	}
	sort.Strings(shards)
	paths := make([]string, len(shards))
	for i, s := range shards {
		paths[i] = filepath.Join(dir, s)
		if _, err := os.Stat(paths[i]); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil, &Error{File: index, Err: fmt.Errorf("%w %s: %w", ErrMissingShard, s, err)}
			}
			return nil, &Error{File: index, Err: err}
		}
	}
	c, err := openFiles(path, dir, paths, o)
	if err != nil {
		return nil, err
	}
	for name, shard := range idx.WeightMap {
		ref, ok := c.tensors[name]
		want := filepath.Join(dir, shard)
		if !ok || ref.file.path != want {
			c.Close()
			return nil, errf(index, name, ErrMissingTensor, "index puts the tensor in %s, which does not hold it", shard)
		}
	}
	return c, nil
}

// openFiles maps (or reads) and validates each file and merges their
// tensors.
func openFiles(path, dir string, paths []string, o OpenOptions) (*Checkpoint, error) {
	c := &Checkpoint{path: path, dir: dir, tensors: make(map[string]tensorRef), metadata: make(map[string]string)}
	for _, p := range paths {
		mf, err := openMapped(p, o)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.files = append(c.files, mf)
		for i := range mf.hdr.tensors {
			t := &mf.hdr.tensors[i]
			if prev, dup := c.tensors[t.name]; dup {
				c.Close()
				return nil, errf(p, t.name, ErrDuplicate, "also in %s", prev.file.path)
			}
			c.tensors[t.name] = tensorRef{file: mf, info: t}
		}
		for k, v := range mf.hdr.metadata {
			if _, ok := c.metadata[k]; !ok {
				c.metadata[k] = v
			}
		}
	}
	c.names = make([]string, 0, len(c.tensors))
	for name := range c.tensors {
		c.names = append(c.names, name)
	}
	sort.Strings(c.names)
	return c, nil
}

func openMapped(path string, o OpenOptions) (*mappedFile, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	size := st.Size()
	var prefix [8]byte
	if size >= 8 {
		if _, err := f.ReadAt(prefix[:], 0); err != nil {
			return nil, &Error{File: path, Err: err}
		}
	}
	n, err := headerLength(path, prefix[:], size)
	if err != nil {
		return nil, err
	}
	var data []byte
	var release func() error
	if o.Copy {
		if data, err = readFile(path, f, size); err != nil {
			return nil, err
		}
		release = func() error { return nil }
	} else if data, release, err = mapFile(f, size); err != nil {
		return nil, &Error{File: path, Err: fmt.Errorf("mmap: %w", err)}
	}
	hdr, err := parseHeader(path, data[8:8+n], size-8-n)
	if err != nil {
		release()
		return nil, err
	}
	return &mappedFile{path: path, data: data, release: release, hdr: hdr}, nil
}

// readFile reads the size bytes of f into memory. A file that has become
// shorter since it was measured is ErrTruncated.
func readFile(path string, f *os.File, size int64) ([]byte, error) {
	if int64(int(size)) != size {
		return nil, &Error{File: path, Err: fmt.Errorf("%d bytes do not fit in this process's memory", size)}
	}
	data := make([]byte, size)
	n, err := f.ReadAt(data, 0)
	if err == io.EOF {
		return nil, errf(path, "", ErrTruncated, "%d bytes, %d when opened (changed while being read)", n, size)
	} else if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	return data, nil
}

// Names returns the names of all tensors, sorted.
func (c *Checkpoint) Names() []string {
	return append([]string(nil), c.names...)
}

// Has reports whether the checkpoint holds a tensor named name.
func (c *Checkpoint) Has(name string) bool {
	_, ok := c.tensors[name]
	return ok
}

// Tensor returns the named tensor. Its Data aliases the read-only mapping (or
// the copy, with OpenOptions.Copy) and is valid until Close; with a mapping,
// nothing is read from disk until Data is used.
func (c *Checkpoint) Tensor(name string) (*Tensor, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return nil, errf(c.path, name, ErrClosed, "")
	}
	ref, ok := c.tensors[name]
	if !ok {
		return nil, errf(c.path, name, ErrMissingTensor, "checkpoint has %d tensors, none of that name", len(c.names))
	}
	start := ref.file.hdr.dataStart
	t := ref.info
	return &Tensor{
		Name:  name,
		DType: t.dtype,
		Shape: append([]int(nil), t.shape...),
		Data:  ref.file.data[start+t.begin : start+t.end : start+t.end],
		File:  ref.file.path,
	}, nil
}

// Metadata returns a copy of the __metadata__ string map, merged across
// shards (the first shard in file-name order wins on conflicting keys).
func (c *Checkpoint) Metadata() map[string]string {
	m := make(map[string]string, len(c.metadata))
	for k, v := range c.metadata {
		m[k] = v
	}
	return m
}

// Dir returns the directory holding the checkpoint's files.
func (c *Checkpoint) Dir() string { return c.dir }

// Files returns the paths of the checkpoint's safetensors files.
func (c *Checkpoint) Files() []string {
	ps := make([]string, len(c.files))
	for i, f := range c.files {
		ps[i] = f.path
	}
	return ps
}

// Close unmaps every file (or lets the copies go). Tensor data obtained
// earlier must not be used afterwards. Close is idempotent.
func (c *Checkpoint) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, f := range c.files {
		if err := f.release(); err != nil {
			errs = append(errs, &Error{File: f.path, Err: fmt.Errorf("munmap: %w", err)})
		}
	}
	return errors.Join(errs...)
}
