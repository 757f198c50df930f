//go:build !linux

package cpu

// hugeBytes is make([]byte, n) (huge pages only on Linux).
func hugeBytes(n int) []byte { return make([]byte, n) }

// hugeMin: the size from which a weight is worth hugeBytes; hugePages:
// none here (bf16 weights are not copied).
const (
	hugeMin   = 2 << 20
	hugePages = false
)
