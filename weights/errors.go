package weights

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by this package wrap one of them inside an
// *Error; test with errors.Is.
var (
	// ErrTruncated: the file ends before its 8-byte header length, its
	// header, or its tensor data.
	ErrTruncated = errors.New("file truncated")
	// ErrHeaderLength: the header length runs past the end of the file or is
	// absurdly large (over MaxHeaderSize).
	ErrHeaderLength = errors.New("bad header length")
	// ErrBadHeader: the header is not a JSON object of the safetensors form.
	ErrBadHeader = errors.New("bad header")
	// ErrUnknownDType: a dtype name this package does not know.
	ErrUnknownDType = errors.New("unknown dtype")
	// ErrOutOfRange: data offsets inverted or past the end of the data.
	ErrOutOfRange = errors.New("data offsets out of range")
	// ErrOverlap: two tensors' data ranges overlap.
	ErrOverlap = errors.New("tensor data overlaps")
	// ErrSizeMismatch: byte size disagrees with dtype and shape.
	ErrSizeMismatch = errors.New("byte size disagrees with dtype and shape")
	// ErrMissingTensor: no tensor of that name (or not where the index says).
	ErrMissingTensor = errors.New("missing tensor")
	// ErrDuplicate: a tensor name appears twice in a file or across shards.
	ErrDuplicate = errors.New("duplicate tensor name")
	// ErrBadIndex: model.safetensors.index.json is malformed.
	ErrBadIndex = errors.New("bad shard index")
	// ErrMissingShard: the index names a shard file that does not exist.
	ErrMissingShard = errors.New("missing shard file")
	// ErrNoCheckpoint: a directory holds no safetensors checkpoint.
	ErrNoCheckpoint = errors.New("no safetensors checkpoint")
	// ErrDType: a conversion the tensor's dtype does not support.
	ErrDType = errors.New("unsupported dtype for conversion")
	// ErrClosed: the checkpoint or writer was closed.
	ErrClosed = errors.New("closed")
	// ErrNotRegular: a path that should be a checkpoint or an index file is a
	// named pipe, a device or another file that is not a regular file (links
	// followed).
	ErrNotRegular = errors.New("not a regular file")
)

// MaxHeaderSize is the largest header length Open accepts (100 MB), checked
// before anything is allocated.
const MaxHeaderSize = 100_000_000

// Error is an error about a checkpoint file, optionally about one tensor.
type Error struct {
	File   string // path of the file (or directory) concerned
	Tensor string // tensor name, "" if the error is about the whole file
	Err    error  // wraps a sentinel such as ErrOverlap
}

func (e *Error) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("weights: %s: tensor %q: %v", e.File, e.Tensor, e.Err)
	}
	return fmt.Sprintf("weights: %s: %v", e.File, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// errf builds an *Error wrapping sentinel with a formatted detail.
func errf(file, tensor string, sentinel error, format string, args ...any) error {
	err := sentinel
	if format != "" {
		err = fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
	}
	return &Error{File: file, Tensor: tensor, Err: err}
}
