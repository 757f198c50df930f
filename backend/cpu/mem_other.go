//go:build !linux

package cpu

// MemoryBytes is the machine's physical memory where the backend can read it
// (Linux); 0, unknown, here.
func (b *Backend) MemoryBytes() int64 { return 0 }
