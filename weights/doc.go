// Package weights reads and writes safetensors checkpoints: single files and
// sharded checkpoints described by model.safetensors.index.json.
//
// Reading is memory-mapped and lazy: Open parses and validates every header
// (offsets in range and non-overlapping, byte sizes matching dtype and shape,
// no duplicate names within or across shards) but touches tensor data only
// when a caller reads Tensor.Data or converts it. Tensor.Data aliases the
// read-only mapping: never write to it, and do not use it after
// Checkpoint.Close. A Checkpoint is safe for concurrent use by multiple
// goroutines until Close. As with any memory map, a file truncated by another
// process while open faults when the missing bytes are read: do not rewrite
// a checkpoint in place while it is open (Writer never does; it renames).
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
