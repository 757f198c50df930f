package cpu

import "syscall"

// MemoryBytes is the machine's physical memory, which every buffer of this
// backend shares (0 when it cannot be read).
func (b *Backend) MemoryBytes() int64 {
	var info syscall.Sysinfo_t
	if syscall.Sysinfo(&info) != nil {
		return 0
	}
	return int64(info.Totalram) * int64(info.Unit)
}
