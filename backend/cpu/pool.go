package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A decode step fans out about 130 times (7 matmuls and an attention a
// layer, the LM head), each a few tens of microseconds at 16 threads.
// Starting goroutines for each costs microseconds per fan-out and delays
// the last ones most: the runtime queues them on the caller's P, and idle
// Ps are woken one after another to steal them. A pool keeps threads-1
// helper goroutines for the Backend's lifetime instead. Each waits for a
// post in its own mailbox, polling it for a while (pollFor) before it parks
// on a channel, so that in a run of decode steps a fan-out is a few stores
// and the helpers start within a cache miss, while an idle backend costs
// no CPU.
//
// The runs of a fan-out are not assigned: the caller and its helpers claim
// them in turn from a counter, so that a helper that starts late (its
// thread descheduled on a busy machine, or parked) finds the runs done by
// the others instead of holding the caller, which waits only for the runs
// claimed. Each run is fn over fixed bounds, whoever runs it: the results
// do not depend on the claiming.

// A waiting helper (for a post) or caller (for its helpers' runs) polls for
// pollFor, then parks. That covers a decode step's gaps between fan-outs
// (norms, RoPE, the activations' quantization, the sampling between
// tokens: microseconds), so that in a run of decode steps the helpers
// start within a cache miss instead of a futex wake-up. Polling takes CPU
// time from other work where the machine has more runnable threads than
// cores: under a load of 3-8 on the shared 2-core development machine,
// decode steps took median 92.2 ms polling 20 µs against 98.5 polling
// 100 µs; on the same machine quieter (load 1.2-1.6), whole decodes of
// issue 61's NVFP4 model on 2 threads, alternated, ran 20.8-22.8 tok/s
// polling 20 µs and 25.8-26.3 polling 500 µs (200 µs 19.0-23.4, 2 ms
// 22.1-23.9: DECISIONS.md, "CPU threads for 16 cores"); llama.cpp's
// threads spin too. A goroutine that polls lets the Go scheduler run
// others on its P (runtime.Gosched) when it has not for yieldEvery: a
// helper that serves a run of decode steps never parks.
const (
	pollFor    = 500 * time.Microsecond
	yieldEvery = time.Millisecond
)

// pool is a Backend's helpers. One fan-out uses them at a time (mu); a
// fan-out that finds them taken (another goroutine's operation, or a
// fan-out inside a fan-out) starts goroutines instead, as before the pool.
type pool struct {
	mu      sync.Mutex
	threads int  // helpers + the caller
	poll    bool // poll before parking: only with a P for every thread
	closed  bool
	gen     uint32    // fan-outs posted
	helpers []*helper // started at the first fan-out
	caller  parker    // the fan-out's caller, waiting for its runs
	_       [64]byte
	// claim is the fan-out's generation (high 32 bits) and its next run
	// (low 32): a late helper's claim of an earlier fan-out fails.
	claim   atomic.Uint64
	_       [64]byte
	done    atomic.Int32 // runs finished
	_       [64]byte
	preDone atomic.Int32 // pre runs finished
	_       [64]byte
}

// helper is one helper goroutine's mailbox, on cache lines of its own. The
// poster writes job, then bumps posted; the helper clears busy when it has
// finished with the job, and only then is it posted again.
type helper struct {
	_      [64]byte
	posted atomic.Uint32
	busy   atomic.Bool
	park   parker
	job    job
	_      [64]byte
}

// job is a fan-out of generation gen: fn over [0, n) in runs of step items,
// after pre over [0, preN) in runs of preStep (none where preN is 0).
type job struct {
	fn                     func(lo, hi int)
	n, step, runs          int
	pre                    func(lo, hi int)
	preN, preStep, preRuns int
	gen                    uint32
	stop                   bool // Close: the helper returns
}

// phase is fn over [0, n) in runs of step items: one phase of a fan-out.
type phase struct {
	n, step int
	fn      func(lo, hi int)
}

// runs is the number of runs.
func (f phase) runs() int {
	if f.n <= 0 {
		return 0
	}
	return (f.n + f.step - 1) / f.step
}

func newPool(threads int) *pool {
	return &pool{threads: threads, poll: threads <= runtime.GOMAXPROCS(0), caller: parker{ch: make(chan struct{}, 1)}}
}

// serve is helper h's goroutine.
func (p *pool) serve(h *helper) {
	var seen uint32
	posted := func() bool { return h.posted.Load() != seen }
	for {
		h.park.wait(posted, p.poll)
		seen = h.posted.Load()
		j := h.job
		h.job = job{} // holds nothing of the caller's while it waits
		if j.stop {
			return
		}
		p.work(&j)
		h.busy.Store(false)
	}
}

// work runs the runs of j it claims until none is left, the pre runs
// first: a run of fn waits until every pre run is done (they are being run:
// a short wait). The one that finishes the last run wakes the caller.
func (p *pool) work(j *job) {
	total := j.preRuns + j.runs
	for {
		c := p.claim.Load()
		i := int(uint32(c))
		if uint32(c>>32) != j.gen || i >= total {
			return
		}
		if !p.claim.CompareAndSwap(c, c+1) {
			continue
		}
		if i < j.preRuns {
			lo := i * j.preStep
			j.pre(lo, min(lo+j.preStep, j.preN))
			p.preDone.Add(1)
		} else {
			for w := 0; int(p.preDone.Load()) != j.preRuns; w++ {
				if w >= 64 || !p.poll {
					runtime.Gosched() // the pre runs' goroutines may need this P
				}
			}
			lo := (i - j.preRuns) * j.step
			j.fn(lo, min(lo+j.step, j.n))
		}
		if int(p.done.Add(1)) == total {
			p.caller.wake()
		}
	}
}

// acquire takes the helpers for one fan-out, starting them the first time;
// false when another fan-out holds them or the pool is closed.
func (p *pool) acquire() bool {
	if !p.mu.TryLock() {
		return false
	}
	if p.closed {
		p.mu.Unlock()
		return false
	}
	if p.helpers == nil {
		p.helpers = make([]*helper, p.threads-1)
		for i := range p.helpers {
			h := &helper{park: parker{ch: make(chan struct{}, 1)}}
			p.helpers[i] = h
			go p.serve(h)
		}
	}
	return true
}

// fanOut runs the phase pre (none where pre.n is 0), then main, on the
// caller and up to workers-1 helpers (acquired), and releases them.
func (p *pool) fanOut(pre, main phase, workers int) {
	defer p.mu.Unlock()
	p.gen++
	j := job{fn: main.fn, n: main.n, step: main.step, runs: main.runs(),
		pre: pre.fn, preN: pre.n, preStep: pre.step, preRuns: pre.runs(), gen: p.gen}
	p.done.Store(0)
	p.preDone.Store(0)
	p.claim.Store(uint64(j.gen) << 32)
	need := min(workers, max(j.runs, j.preRuns)) - 1
	for _, h := range p.helpers {
		if need == 0 {
			break
		}
		if h.busy.Load() { // still on an earlier fan-out: late, not posted
			continue
		}
		need--
		h.busy.Store(true)
		h.job = j
		h.posted.Add(1)
		h.park.wake()
	}
	p.work(&j)
	total := j.preRuns + j.runs
	p.caller.wait(func() bool { return int(p.done.Load()) == total }, p.poll)
}

// close stops the helpers (Backend.Close, or the Backend's cleanup), each
// once it has finished with any job.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, h := range p.helpers {
		for h.busy.Load() {
			runtime.Gosched()
		}
		h.job = job{stop: true}
		h.posted.Add(1)
		h.park.wake()
	}
	p.helpers = nil
}

// parker lets a goroutine wait until a condition holds, which another
// goroutine makes true and then calls wake; wake may come before the wait
// parks, or while it polls.
type parker struct {
	parked  atomic.Bool
	ch      chan struct{} // one token, sent by the wake that unparks
	yielded time.Time     // the waiter's last runtime.Gosched
}

// wait returns once ready() holds: polling first (poll), then parked.
func (k *parker) wait(ready func() bool, poll bool) {
	if poll && k.poll(ready) {
		return
	}
	for !ready() {
		k.parked.Store(true)
		if ready() {
			// wake may have seen parked and be sending: take its token.
			if !k.parked.CompareAndSwap(true, false) {
				<-k.ch
			}
			return
		}
		<-k.ch
	}
}

// poll polls ready for pollFor and reports whether it holds.
func (k *parker) poll(ready func() bool) bool {
	start := time.Now()
	for i := 1; ; i++ {
		if ready() {
			return true
		}
		if i%64 != 0 {
			continue
		}
		now := time.Now()
		if now.Sub(k.yielded) > yieldEvery {
			k.yielded = now
			runtime.Gosched()
		}
		if now.Sub(start) > pollFor {
			return false
		}
	}
}

// wake unparks a parked waiter; the caller has made its condition true.
func (k *parker) wake() {
	if k.parked.CompareAndSwap(true, false) {
		k.ch <- struct{}{}
	}
}
