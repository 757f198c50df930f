package weights

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
)

// Writer writes one safetensors file. Add streams each tensor's bytes to a
// temporary data file at once, so memory stays bounded whatever the total
// size; Close writes the header, appends the data and renames the result to
// its final path. Until Close succeeds nothing exists under that path.
type Writer struct {
	path     string
	metadata map[string]string
	data     *os.File // temporary holding the data section
	entries  []tensorInfo
	names    map[string]struct{}
	size     int64 // bytes of data written
	addState
}

// addState is what Writer and ShardedWriter hold to refuse an Add.
type addState struct {
	err    error // sticky I/O error
	closed bool
}

// admit checks a tensor about to be added to file: ErrClosed after Close,
// the sticky error of an earlier failed write, else validateAdd's verdict.
func (a *addState) admit(file, name string, dtype DType, shape []int, data []byte) error {
	if a.closed {
		return errf(file, name, ErrClosed, "")
	}
	if a.err != nil {
		return a.err
	}
	return validateAdd(file, name, dtype, shape, data)
}

// Create starts a safetensors file at path with the given __metadata__
// (may be nil).
func Create(path string, metadata map[string]string) (*Writer, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.data.tmp")
	if err != nil {
		return nil, &Error{File: path, Err: err}
	}
	md := make(map[string]string, len(metadata))
	for k, v := range metadata {
		md[k] = v
	}
	return &Writer{path: path, metadata: md, data: f, names: make(map[string]struct{})}, nil
}

// validateAdd checks a tensor about to be written to file.
func validateAdd(file, name string, dtype DType, shape []int, data []byte) error {
	switch {
	case name == "" || name == "__metadata__":
		return errf(file, name, ErrBadHeader, "invalid tensor name")
	case !dtype.Valid():
		return errf(file, name, ErrUnknownDType, "%v", dtype)
	}
	size, ok := byteSize(dtype, shape)
	if !ok || size != int64(len(data)) {
		return errf(file, name, ErrSizeMismatch, "%s %v needs %s bytes, got %d", dtype, shape, sizeString(size, ok), len(data))
	}
	return nil
}

// Add appends a tensor. data holds its little-endian bytes and must be
// exactly prod(shape)*dtype.Size() long; it is copied before Add returns.
// An invalid tensor (size mismatch, duplicate name, bad dtype) is rejected
// with an error and leaves the writer usable.
func (w *Writer) Add(name string, dtype DType, shape []int, data []byte) error {
	if err := w.admit(w.path, name, dtype, shape, data); err != nil {
		return err
	}
	if _, dup := w.names[name]; dup {
		return errf(w.path, name, ErrDuplicate, "added twice")
	}
	if _, err := w.data.Write(data); err != nil {
		w.err = &Error{File: w.path, Tensor: name, Err: err}
		return w.err
	}
	w.names[name] = struct{}{}
	w.entries = append(w.entries, tensorInfo{
		name: name, dtype: dtype, shape: append([]int(nil), shape...),
		begin: w.size, end: w.size + int64(len(data)),
	})
	w.size += int64(len(data))
	return nil
}

// encodeHeader returns the JSON header for entries, padded with spaces to a
// multiple of 8 bytes so the data section starts aligned.
func encodeHeader(metadata map[string]string, entries []tensorInfo) ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	if len(metadata) > 0 {
		md, err := json.Marshal(metadata)
		if err != nil {
			return nil, err
		}
		b.WriteString(`"__metadata__":`)
		b.Write(md)
	}
	for i, e := range entries {
		if i > 0 || len(metadata) > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(e.name)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteString(`:{"dtype":"`)
		b.WriteString(e.dtype.String())
		b.WriteString(`","shape":[`)
		for j, d := range e.shape {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(d))
		}
		b.WriteString(`],"data_offsets":[`)
		b.WriteString(strconv.FormatInt(e.begin, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(e.end, 10))
		b.WriteString("]}")
	}
	b.WriteByte('}')
	for b.Len()%8 != 0 {
		b.WriteByte(' ')
	}
	return b.Bytes(), nil
}

// Close writes the file and renames it into place. After a failed Add or
// Close, temporaries are removed and nothing is left at the final path.
func (w *Writer) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	dataPath := w.data.Name()
	defer os.Remove(dataPath)
	defer w.data.Close()
	if w.err != nil {
		return w.err
	}
	w.err = w.finish()
	return w.err
}

func (w *Writer) finish() error {
	hdr, err := encodeHeader(w.metadata, w.entries)
	if err != nil {
		return &Error{File: w.path, Err: err}
	}
	if len(hdr) > MaxHeaderSize {
		return errf(w.path, "", ErrHeaderLength, "header of %d bytes exceeds %d", len(hdr), MaxHeaderSize)
	}
	out, err := os.CreateTemp(filepath.Dir(w.path), "."+filepath.Base(w.path)+".*.tmp")
	if err != nil {
		return &Error{File: w.path, Err: err}
	}
	tmp := out.Name()
	fail := func(err error) error {
		out.Close()
		os.Remove(tmp)
		return &Error{File: w.path, Err: err}
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hdr)))
	if _, err := out.Write(n[:]); err != nil {
		return fail(err)
	}
	if _, err := out.Write(hdr); err != nil {
		return fail(err)
	}
	if _, err := w.data.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	if copied, err := io.Copy(out, w.data); err != nil || copied != w.size {
		return fail(fmt.Errorf("copying tensor data: %d of %d bytes: %v", copied, w.size, err))
	}
	if err := out.Sync(); err != nil {
		return fail(err)
	}
	if err := out.Close(); err != nil {
		os.Remove(tmp)
		return &Error{File: w.path, Err: err}
	}
	if err := os.Rename(tmp, w.path); err != nil {
		os.Remove(tmp)
		return &Error{File: w.path, Err: err}
	}
	return nil
}

// ShardedWriter writes a checkpoint split into shards of at most about
// maxShardBytes of tensor data: model-00001-of-0000N.safetensors plus
// model.safetensors.index.json, or a single model.safetensors when everything
// fits in one shard. A tensor larger than maxShardBytes gets a shard of its
// own. Data streams through to disk, so memory stays bounded. Shards are
// written under temporary names and renamed at Close, the index last.
type ShardedWriter struct {
	dir      string
	max      int64
	metadata map[string]string
	cur      *Writer
	curBytes int64
	shards   []string       // temporary paths of shards, in order
	where    map[string]int // tensor -> shard index
	total    int64          // bytes of tensor data
	addState
}

// NewShardedWriter starts a sharded checkpoint in dir (created if needed).
func NewShardedWriter(dir string, maxShardBytes int64, metadata map[string]string) *ShardedWriter {
	return &ShardedWriter{dir: dir, max: maxShardBytes, metadata: metadata, where: make(map[string]int)}
}

func (s *ShardedWriter) shardTemp(i int) string {
	return filepath.Join(s.dir, fmt.Sprintf(".model-shard-%05d.safetensors.tmp", i+1))
}

// Add appends a tensor, starting a new shard when the current one would
// exceed the shard size. Validation as for Writer.Add, and names must be
// unique across all shards.
func (s *ShardedWriter) Add(name string, dtype DType, shape []int, data []byte) error {
	if err := s.admit(s.dir, name, dtype, shape, data); err != nil {
		return err
	}
	if i, dup := s.where[name]; dup {
		return errf(s.dir, name, ErrDuplicate, "already added to shard %d", i+1)
	}
	if s.cur != nil && s.curBytes > 0 && s.curBytes+int64(len(data)) > s.max {
		if err := s.flush(); err != nil {
			return err
		}
	}
	if s.cur == nil {
		if len(s.shards) == 0 {
			if err := os.MkdirAll(s.dir, 0o755); err != nil {
				s.err = &Error{File: s.dir, Err: err}
				return s.err
			}
		}
		w, err := Create(s.shardTemp(len(s.shards)), s.metadata)
		if err != nil {
			s.err = err
			return err
		}
		s.cur, s.curBytes = w, 0
		s.shards = append(s.shards, w.path)
	}
	if err := s.cur.Add(name, dtype, shape, data); err != nil {
		s.err = err
		return err
	}
	s.where[name] = len(s.shards) - 1
	s.curBytes += int64(len(data))
	s.total += int64(len(data))
	return nil
}

func (s *ShardedWriter) flush() error {
	err := s.cur.Close()
	s.cur = nil
	if err != nil {
		s.err = err
	}
	return err
}

func (s *ShardedWriter) cleanup() {
	if s.cur != nil {
		s.cur.Close()
		s.cur = nil
	}
	for _, p := range s.shards {
		os.Remove(p)
	}
}

// Close finishes the last shard, renames the shards to their final names and
// writes the index. On failure it removes the temporaries.
func (s *ShardedWriter) Close() error {
	if s.closed {
		return s.err
	}
	s.closed = true
	if s.err == nil && len(s.shards) == 0 { // no tensors: an empty checkpoint
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			s.err = &Error{File: s.dir, Err: err}
		} else if w, err := Create(s.shardTemp(0), s.metadata); err != nil {
			s.err = err
		} else {
			s.cur = w
			s.shards = append(s.shards, w.path)
		}
	}
	if s.err == nil && s.cur != nil {
		s.flush()
	}
	if s.err != nil {
		s.cleanup()
		return s.err
	}
	s.err = s.publish()
	if s.err != nil {
		s.cleanup()
	}
	return s.err
}

func (s *ShardedWriter) publish() error {
	if len(s.shards) == 1 {
		final := filepath.Join(s.dir, SingleFileName)
		if err := os.Rename(s.shards[0], final); err != nil {
			return &Error{File: final, Err: err}
		}
		// A stale index would shadow the new single file.
		if err := os.Remove(filepath.Join(s.dir, IndexFileName)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return &Error{File: filepath.Join(s.dir, IndexFileName), Err: err}
		}
		return nil
	}
	n := len(s.shards)
	finals := make([]string, n)
	for i := range s.shards {
		finals[i] = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n)
	}
	weightMap := make(map[string]string, len(s.where))
	for name, i := range s.where {
		weightMap[name] = finals[i]
	}
	idx, err := json.MarshalIndent(struct {
		Metadata  map[string]any    `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}{map[string]any{"total_size": s.total}, weightMap}, "", "  ")
	if err != nil {
		return &Error{File: s.dir, Err: err}
	}
	for i, p := range s.shards {
		dst := filepath.Join(s.dir, finals[i])
		if err := os.Rename(p, dst); err != nil {
			return &Error{File: dst, Err: err}
		}
		s.shards[i] = dst // cleanup after a later failure removes the renamed shard
	}
	return writeFileAtomic(filepath.Join(s.dir, IndexFileName), append(idx, '\n'))
}

// writeFileAtomic writes data to a temporary file beside path and renames it.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return &Error{File: path, Err: err}
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return &Error{File: path, Err: err}
	}
	return nil
}
