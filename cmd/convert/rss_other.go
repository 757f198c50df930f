//go:build !(linux || darwin || freebsd)

package main

// maxRSS is unknown on this platform.
func maxRSS() int64 { return 0 }
