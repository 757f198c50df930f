//go:build !unix

package cpu

func processCPU() float64 { return 0 }
