// Package weights reads and writes safetensors checkpoints: single files and
// sharded checkpoints described by model.safetensors.index.json.
//
// Reading is memory-mapped and lazy: Open parses and validates every header
// (offsets in range and non-overlapping, byte sizes matching dtype and shape,
// no duplicate names within or across shards) but touches tensor data only
// when a caller reads Tensor.Data or converts it. Tensor.Data aliases the
// read-only mapping: never write to it, and do not use it after
// Checkpoint.Close. A Checkpoint is safe for concurrent use by multiple
// goroutines until Close.
//
// A mapping reads the file as it is now, not as it was at Open. A file
// truncated by another process while open kills this process with SIGBUS
// when the missing bytes are read (a fatal runtime error, not a panic: it
// happens in whichever goroutine reads the tensor, usually a backend's
// matmul worker), and a file rewritten in place changes the tensors under
// the reader. Replacing a file by renaming a new one over it is safe: the
// mapping keeps the old file (Writer publishes that way). A long-running
// program whose checkpoint may be rewritten opens it with
// OpenWith(path, OpenOptions{Copy: true}) (engine.Options.CopyWeights),
// which reads every file into memory at open: later changes to the files do
// nothing, for the cost of the read and of the checkpoint's size in private
// memory (docs/DECISIONS.md has the measurement).
//
// Writer and ShardedWriter stream tensors to disk with bounded memory and
// publish files by renaming temporaries, so a crash never leaves a
// half-written checkpoint under the final names.
//
// Every error about a file is an *Error naming the file (and the tensor when
// there is one) and wrapping one of the sentinel errors (ErrTruncated,
// ErrBadHeader, ErrOverlap, ...), so callers can test it with errors.Is.
// A checkpoint or index path that is not a regular file once links are
// followed (a named pipe, a device) is ErrNotRegular, found before anything
// is read from it.
//
// The package owns the container format only. It must not interpret tensor
// names or model layouts (package model does) nor implement number formats
// beyond widening stored values to float32/int64 (package quant owns those).
package weights
