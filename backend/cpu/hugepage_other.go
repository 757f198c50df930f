//go:build !linux

package cpu

// hugeBytes is make([]byte, n) (huge pages only on Linux).
func hugeBytes(n int) []byte { return make([]byte, n) }

// hugeMin: the size from which a weight is worth hugeBytes.
const hugeMin = 2 << 20
