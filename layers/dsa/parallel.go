package dsa

import (
	"sync"
	"sync/atomic"
)

// parallel calls fn(worker, i) for every i in [0, n) on up to workers
// goroutines, handing out indices one at a time (rows of a causal block cost
// different amounts). worker is in [0, workers) and identifies the goroutine,
// for per-worker scratch memory.
func parallel(n, workers int, fn func(worker, i int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for i := range n {
			fn(0, i)
		}
		return
	}
	var wg sync.WaitGroup
	var next atomic.Int64
	for wk := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(wk, i)
			}
		}()
	}
	wg.Wait()
}
