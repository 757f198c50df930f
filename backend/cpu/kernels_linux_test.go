package cpu

import (
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"

	"github.com/manifoldlm/manifold/quant"
)

// threadCPU is this thread's CPU time in seconds (RUSAGE_THREAD).
func threadCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(1, &ru) != nil { // RUSAGE_THREAD
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// BenchmarkKernels times the matmul kernels on operands held in cache, one
// thread, and reports their rate per CPU-second of that thread (multiply-adds,
// or values for the quantizer): the compute bound of each, comparable on a
// machine other work shares. K = 2048.
func BenchmarkKernels(b *testing.B) {
	const K = 2048
	rng := rand.New(rand.NewPCG(1, 2))
	x := randn(rng, 6*K)
	wf := randn(rng, 4*K)
	data, _ := bf16Bytes(wf)
	wb := make([]uint16, 4*K)
	for i := range wb {
		wb[i] = uint16(data[2*i]) | uint16(data[2*i+1])<<8
	}
	q, err := quant.QuantizeNVFP4(wf, 4, K)
	if err != nil {
		b.Fatal(err)
	}
	qw := newQ8Weight(q, serialPar)
	acts := newQ8Act(qw.groups, 4)
	for i := range acts {
		quantizeQ8(acts[i], x[i*K:(i+1)*K], qw.groups)
	}
	q16 := newQ16Weight(q, serialPar)
	a16 := newQ16Act(q16.groups, 4)
	for i := range a16 {
		quantizeQ16(a16[i], x[i*K:(i+1)*K], q16.groups)
	}
	var acc [96]float32
	var o [4]float32
	var o8 [8]float32
	a8 := newQ16Act(q16.groups, 8) // x holds 6 tokens: tokens 6, 7 repeat 0, 1
	for i := range a8 {
		quantizeQ16(a8[i], x[i%6*K:(i%6+1)*K], q16.groups)
	}
	avx2 := func(fn func()) func() {
		return func() { forceAVX2 = true; fn(); forceAVX2 = false }
	}
	for _, c := range []struct {
		name string
		work float64
		fn   func()
	}{
		{"f32-4x3", 12 * K, func() { dot4x3(wf, K, x, K, K, &acc) }},
		{"bf16-4x3", 12 * K, func() { dot4x3(wb, K, x, K, K, &acc) }},
		{"bf16-4x1", 4 * K, func() { matvecBF16(o[:], x[:K], wb, K, 0, 4) }},
		{"bf16-4x3-avx2", 12 * K, avx2(func() { dot4x3(wb, K, x, K, K, &acc) })},
		{"bf16-4x1-avx2", 4 * K, avx2(func() { matvecBF16(o[:], x[:K], wb, K, 0, 4) })},
		{"nvfp4-q16-row4", 4 * K, func() { row4Q16(q16.codes, q16.scales, a16[:4], q16.groups, &o) }},
		{"nvfp4-q16-row8", 8 * K, func() { row8Q16(q16.codes, q16.scales, a8, q16.groups, &o8) }},
		{"nvfp4-q16-dot4", 4 * K, func() { dot4Q16(q16.codes, q16.scales, a16[0], q16.groups, &o) }},
		{"nvfp4-row4", 4 * K, func() { row4Q8(qw.codes, qw.scales, acts, qw.groups, &o) }},
		{"nvfp4-dot4", 4 * K, func() { dot4Q8(qw.codes, qw.scales, acts[0], qw.groups, &o) }},
		{"nvfp4-ref", 4 * K, func() { q.MatVecRows(o[:], x, 0, 4) }},
		{"quantize", K, func() { quantizeQ8(acts[0], x[:K], qw.groups) }},
		{"quantize-q16", K, func() { quantizeQ16(a16[0], x[:K], q16.groups) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c.fn()
			t0 := threadCPU()
			for b.Loop() {
				c.fn()
			}
			if t := threadCPU() - t0; t > 0 {
				b.ReportMetric(c.work*float64(b.N)/t/1e9, "G/cpu-s")
			}
		})
	}
}
