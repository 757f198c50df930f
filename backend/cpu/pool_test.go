package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFanOut: parallel and parallelDynamic run every item once, on the
// pool, on goroutines when the pool is taken (a fan-out inside a fan-out,
// another goroutine's fan-out) and after Close.
func TestFanOut(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 16} {
		for _, c := range []struct{ n, grain int }{{1, 1}, {7, 1}, {100, 1}, {100, 30}, {1000, 7}, {5, 10}} {
			b := New(threads)
			check := func(name string, run func(fn func(lo, hi int))) {
				t.Helper()
				seen := make([]atomic.Int32, c.n)
				run(func(lo, hi int) {
					for i := lo; i < hi; i++ {
						seen[i].Add(1)
					}
				})
				for i := range seen {
					if v := seen[i].Load(); v != 1 {
						t.Fatalf("threads %d, n %d, grain %d, %s: item %d ran %d times", threads, c.n, c.grain, name, i, v)
					}
				}
			}
			par := func(fn func(lo, hi int)) { b.parallel(c.n, c.grain, fn) }
			dyn := func(fn func(lo, hi int)) { b.parallelDynamic(c.n, c.grain, fn) }
			for range 3 { // the helpers serve one fan-out after another
				check("parallel", par)
				check("parallelDynamic", dyn)
			}
			check("nested", func(fn func(lo, hi int)) {
				b.parallel(2, 1, func(lo, hi int) {
					if lo == 0 {
						par(fn)
					}
				})
			})
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() { check("concurrent", dyn) })
			}
			wg.Wait()
			b.Close()
			check("closed", par)
			check("closed", dyn)
		}
	}
}

// TestPoolCleanup: a Backend dropped without Close stops its helpers.
func TestPoolCleanup(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		b := New(8)
		b.parallel(8, 1, func(lo, hi int) {})
	}()
	for range 100 {
		runtime.GC()
		if runtime.NumGoroutine() <= before {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%d goroutines, %d before the backend", runtime.NumGoroutine(), before)
}

// BenchmarkFanOut times one fan-out of b.threads (GOMAXPROCS: -cpu sets
// it) runs of a few hundred nanoseconds each, on the pool and on
// goroutines started for each (the pool held, as before it existed), back
// to back and with a serial gap between fan-outs like a decode step's
// (norms, quantization). The ns/op less the gap and one run is the
// fan-out's cost.
func BenchmarkFanOut(b *testing.B) {
	for _, gap := range []time.Duration{0, 5 * time.Microsecond} {
		for _, onPool := range []bool{true, false} {
			name := fmt.Sprintf("gap=%v/pool", gap)
			if !onPool {
				name = fmt.Sprintf("gap=%v/goroutines", gap)
			}
			b.Run(name, func(bb *testing.B) {
				be := New(0)
				defer be.Close()
				if !onPool {
					be.pool.mu.Lock() // acquire fails: the goroutines path
					defer be.pool.mu.Unlock()
				}
				var sink [64]atomic.Int64
				work := func(lo, hi int) {
					s := 0
					for i := range 200 {
						s += i * lo
					}
					sink[lo%len(sink)].Add(int64(s))
				}
				for bb.Loop() {
					be.parallel(be.threads, 1, work)
					for start := time.Now(); time.Since(start) < gap; {
					}
				}
			})
		}
	}
}

// TestFanOutAllocs: a fan-out on the pool allocates nothing (the fn
// closures of the ops are their own).
func TestFanOutAllocs(t *testing.T) {
	b := New(runtime.GOMAXPROCS(0))
	defer b.Close()
	var sink atomic.Int64
	fn := func(lo, hi int) { sink.Add(int64(hi - lo)) }
	b.parallel(64, 1, fn) // starts the helpers
	if n := testing.AllocsPerRun(100, func() { b.parallel(64, 1, fn) }); n != 0 {
		t.Errorf("parallel: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { b.parallelDynamic(64, 3, fn) }); n != 0 {
		t.Errorf("parallelDynamic: %v allocations", n)
	}
}
