package cpu

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeBytes is make([]byte, n) for a large weight, its memory aligned to 2
// MiB and marked for transparent huge pages (MADV_HUGEPAGE; the default
// "madvise" mode gives them only to such ranges): a matvec streams the
// weight once a token, and 4 KiB pages cost a TLB miss every 4 KiB.
func hugeBytes(n int) []byte {
	const huge = hugeMin
	if n < huge {
		return make([]byte, n)
	}
	buf := make([]byte, n+huge)
	off := 0
	if r := int(uintptrOf(buf) % huge); r != 0 {
		off = huge - r
	}
	b := buf[off : off+n : off+n]
	_ = unix.Madvise(buf[off:off+n&^(huge-1)], unix.MADV_HUGEPAGE) // advice only: an error leaves 4 KiB pages
	return b
}

// hugeMin is the huge page size, below which hugeBytes is make; hugePages
// says that hugeBytes gives them.
const (
	hugeMin   = 2 << 20
	hugePages = true
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
