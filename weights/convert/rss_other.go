//go:build !(linux || darwin || freebsd)

package convert

// maxRSS is unknown on this platform.
func maxRSS() int64 { return 0 }
