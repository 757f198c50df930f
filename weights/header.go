package weights

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
)

// tensorInfo is one validated header entry. Offsets are relative to the
// start of the data section (after the 8-byte length and the header).
type tensorInfo struct {
	name       string
	dtype      DType
	shape      []int
	begin, end int64
}

// header is a parsed, validated safetensors header.
type header struct {
	tensors   []tensorInfo // header order
	metadata  map[string]string
	dataStart int64 // 8 + header length
}

// headerLength validates the 8-byte little-endian header length at the start
// of a file of fileSize bytes and returns it.
func headerLength(file string, prefix []byte, fileSize int64) (int64, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return 0, errf(file, "", ErrTruncated, "%d bytes, shorter than the 8-byte header length", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeaderSize {
		return 0, errf(file, "", ErrHeaderLength, "header length %d exceeds the %d-byte limit", n, MaxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return 0, &Error{File: file, Err: fmt.Errorf("%w: header length %d runs past the end of the %d-byte file (%w)",
			ErrHeaderLength, n, fileSize, ErrTruncated)}
	}
	return int64(n), nil
}

// parseFile parses and validates a whole safetensors file held in memory.
func parseFile(file string, b []byte) (*header, error) {
	n, err := headerLength(file, b, int64(len(b)))
	if err != nil {
		return nil, err
	}
	return parseHeader(file, b[8:8+n], int64(len(b))-8-n)
}

type rawEntry struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// parseHeader parses the JSON header hdr of a file whose data section holds
// dataLen bytes, and validates every entry against it.
func parseHeader(file string, hdr []byte, dataLen int64) (*header, error) {
	h := &header{dataStart: 8 + int64(len(hdr))}
	var entryErr error // an *Error about one entry, returned as is
	err := decodeObject(hdr, func(name string, dec *json.Decoder) error {
		if name == "__metadata__" {
			if err := dec.Decode(&h.metadata); err != nil {
				entryErr = errf(file, "", ErrBadHeader, "__metadata__ is not an object of strings: %v", err)
				return entryErr
			}
			return nil
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			entryErr = errf(file, name, ErrBadHeader, "entry is not {dtype, shape, data_offsets}: %v", err)
			return entryErr
		}
		t, err := checkEntry(file, name, &e, dataLen)
		if err != nil {
			entryErr = err
			return err
		}
		h.tensors = append(h.tensors, t)
		return nil
	})
	if err != nil {
		if entryErr != nil {
			return nil, entryErr
		}
		var dup duplicateKeyError
		if errors.As(err, &dup) {
			return nil, errf(file, string(dup), ErrDuplicate, "name appears twice in the header")
		}
		return nil, errf(file, "", ErrBadHeader, "%v", err)
	}
	if err := checkOverlap(file, h.tensors); err != nil {
		return nil, err
	}
	return h, nil
}

// checkEntry validates one decoded header entry.
func checkEntry(file, name string, e *rawEntry, dataLen int64) (tensorInfo, error) {
	if e.DType == nil || e.Shape == nil || e.DataOffsets == nil {
		return tensorInfo{}, errf(file, name, ErrBadHeader, "entry lacks dtype, shape or data_offsets")
	}
	dt, err := ParseDType(*e.DType)
	if err != nil {
		return tensorInfo{}, &Error{File: file, Tensor: name, Err: err}
	}
	t := tensorInfo{name: name, dtype: dt, shape: make([]int, len(*e.Shape))}
	for i, d := range *e.Shape {
		if d < 0 {
			return tensorInfo{}, errf(file, name, ErrBadHeader, "negative dimension %d in shape %v", d, *e.Shape)
		}
		t.shape[i] = int(d)
	}
	off := *e.DataOffsets
	if len(off) != 2 {
		return tensorInfo{}, errf(file, name, ErrBadHeader, "data_offsets has %d values, want 2", len(off))
	}
	t.begin, t.end = off[0], off[1]
	if t.begin < 0 || t.end < t.begin {
		return tensorInfo{}, errf(file, name, ErrOutOfRange, "data_offsets [%d, %d] inverted or negative", t.begin, t.end)
	}
	want, ok := byteSize(dt, t.shape)
	if !ok || want != t.end-t.begin {
		return tensorInfo{}, errf(file, name, ErrSizeMismatch, "%s %v needs %s bytes, data_offsets [%d, %d] hold %d",
			dt, t.shape, sizeString(want, ok), t.begin, t.end, t.end-t.begin)
	}
	if t.end > dataLen {
		return tensorInfo{}, &Error{File: file, Tensor: name, Err: fmt.Errorf(
			"%w: data_offsets [%d, %d] past the end of the %d-byte data section (%w)",
			ErrOutOfRange, t.begin, t.end, dataLen, ErrTruncated)}
	}
	return t, nil
}

func sizeString(n int64, ok bool) string {
	if !ok {
		return "more than 2^63"
	}
	return fmt.Sprint(n)
}

// byteSize returns prod(shape)*dtype.Size(), or false on overflow.
func byteSize(dt DType, shape []int) (int64, bool) {
	n := int64(dt.Size())
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
	}
	if slices.Contains(shape, 0) {
		return 0, true
	}
	for _, d := range shape {
		if n > math.MaxInt64/int64(d) {
			return 0, false
		}
		n *= int64(d)
	}
	return n, true
}

// checkOverlap reports the first pair of non-empty tensors whose byte ranges
// intersect.
func checkOverlap(file string, ts []tensorInfo) error {
	idx := make([]int, 0, len(ts))
	for i := range ts {
		if ts[i].end > ts[i].begin {
			idx = append(idx, i)
		}
	}
	sort.Slice(idx, func(a, b int) bool { return ts[idx[a]].begin < ts[idx[b]].begin })
	for k := 1; k < len(idx); k++ {
		prev, cur := &ts[idx[k-1]], &ts[idx[k]]
		if cur.begin < prev.end {
			return errf(file, cur.name, ErrOverlap, "data_offsets [%d, %d] overlap tensor %q [%d, %d]",
				cur.begin, cur.end, prev.name, prev.begin, prev.end)
		}
	}
	return nil
}

type duplicateKeyError string

func (d duplicateKeyError) Error() string { return fmt.Sprintf("duplicate key %q", string(d)) }

// decodeObject walks a JSON object, calling value for each key with the
// decoder positioned at its value (value must consume exactly that value).
// It rejects duplicate keys (which encoding/json would silently merge),
// non-objects and trailing data. An error from value is returned as is.
func decodeObject(data []byte, value func(key string, dec *json.Decoder) error) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("not a JSON object (starts with %v)", tok)
	}
	seen := make(map[string]struct{})
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not JSON: %v", err)
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("not JSON: object key %v", tok)
		}
		if _, dup := seen[key]; dup {
			return duplicateKeyError(key)
		}
		seen[key] = struct{}{}
		if err := value(key, dec); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("not JSON: %v", err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON object (%v)", tok)
	}
	return nil
}

// skipValue consumes one JSON value.
func skipValue(_ string, dec *json.Decoder) error {
	var raw json.RawMessage
	return dec.Decode(&raw)
}
