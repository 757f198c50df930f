package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/model"
)

// BatchOptions tune the scheduler that runs the steps of the sessions of a
// model that generate at once as one batched forward pass (continuous
// batching: sessions join and leave between steps). Architectures that
// cannot batch (model.BatchForwarder: Llama and Qwen3 can, DeepSeek cannot
// yet) run each session alone as before. The zero value is the default of
// each; no value changes what a session computes, only when its rows run.
type BatchOptions struct {
	// Off runs every session alone (no scheduler).
	Off bool
	// MaxSequences bounds the sequences of one step (0: 64). Sessions past
	// it wait for the next step, oldest first.
	MaxSequences int
	// StepTokens bounds the tokens of one step (0: 512, the prefill chunk
	// of a session alone): every decoding session's token first, then
	// prompt chunks (chunked prefill), oldest first, so that a long prompt
	// does not stall the streams decoding beside it. A smaller budget
	// splits a lone prompt too: on the GPU the 512-token prefill of the
	// Llama-3-8B shape took 50.2 ms in two steps of 256 against 37.5 ms in
	// one (H100; DECISIONS.md).
	StepTokens int
	// Gather is the longest a step waits, once a session has queued its
	// tokens, for the other sessions generating to queue theirs (0: 2ms;
	// negative: no wait). A session whose stream callback is slow holds
	// the others back by at most this much a step.
	Gather time.Duration
}

func (o BatchOptions) withDefaults() BatchOptions {
	if o.MaxSequences <= 0 {
		o.MaxSequences = 64
	}
	if o.StepTokens <= 0 {
		o.StepTokens = prefillChunk
	}
	if o.Gather == 0 {
		o.Gather = 2 * time.Millisecond
	}
	return o
}

func (o BatchOptions) validate() error {
	if o.MaxSequences < 0 || o.StepTokens < 0 {
		return fmt.Errorf("engine: Options.Batch.MaxSequences %d, StepTokens %d: want >= 0 (0: the default)", o.MaxSequences, o.StepTokens)
	}
	return nil
}

// BatchStats are the scheduler's counts since Load (all zero for a model
// that does not batch).
type BatchStats struct {
	Steps     int64 // batched forward passes run
	Rows      int64 // tokens run by them
	Sequences int64 // sequences summed over the steps (Sequences/Steps: the mean batch)
	Active    int   // sessions generating now
	Queued    int   // sessions waiting for a step now
	LastBatch int   // sequences of the last step
}

// batchRequest is a session's tokens waiting for the scheduler.
type batchRequest struct {
	ctx    context.Context
	st     model.State
	ids    []int32             // tokens to run
	ran    int                 // of ids, run so far
	pick   *backend.SamplePick // the device picks the token with these options (its Row set by step); nil: the logits come to the host
	logits []float32
	id     int // the pick, when pick is set
	err    error
	done   chan struct{}
}

// scheduler runs the queued tokens of a model's sessions as batched steps.
// Its loop runs in a goroutine while anything is queued.
type scheduler struct {
	bf    model.BatchForwarder
	vocab int
	opts  BatchOptions
	// Picks on the device: the step's logits stay on b, and the tokens of
	// the requests that ask for it are picked there (nil: none).
	b   backend.Backend
	dbf model.BatchDeviceForwarder
	bs  backend.BatchTokenSampler

	mu      sync.Mutex
	queue   []*batchRequest // arrival order
	active  int             // sessions between enter and leave
	running bool            // the loop's goroutine is up
	arrived chan struct{}   // a request was queued (capacity 1)
	stats   BatchStats
	waited  int64     // gathers that ended at the Gather deadline (benchmarks)
	times   stepTimes // where the steps' time went (benchmarks)
}

// stepTimes split the scheduler's time since Load by phase, for the
// serving benchmarks (a few clock reads a step; no result depends on
// them). A prefill step is one that runs a prompt chunk of more than one
// token beside any decode tokens; a decode step runs one token a request.
type stepTimes struct {
	prefillSteps, decodeSteps int64
	prefillSeqs, decodeSeqs   int64         // sequences summed over those steps
	prefillRows               int64         // tokens run by the prefill steps
	prefillWall, decodeWall   time.Duration // each step's pick to its requests ended
	gather                    time.Duration // waiting for the active sessions' tokens
	pick                      time.Duration // choosing the step's requests (s.mu held)
	queue                     time.Duration // the forward pass queued (and, on the GPU, mostly launched)
	sample                    time.Duration // the device picks: their launch and the wait for the ids (the step's device time left)
	read                      time.Duration // logits read back to the host (rows not picked on the device)
	sync                      time.Duration // the final synchronization
	finish                    time.Duration // ending the requests, s.mu held
}

func newScheduler(net model.Model, o BatchOptions, b backend.Backend) *scheduler {
	bf, ok := net.(model.BatchForwarder)
	if !ok || o.Off {
		return nil
	}
	s := &scheduler{bf: bf, vocab: net.Config().VocabSize, opts: o.withDefaults(), arrived: make(chan struct{}, 1)}
	if dbf, ok := net.(model.BatchDeviceForwarder); ok {
		if bs := backend.CapabilitiesOf(b).BatchSampler; bs != nil {
			s.b, s.dbf, s.bs = b, dbf, bs
		}
	}
	return s
}

// picksOnDevice reports whether forwardPick picks on the device.
func (s *scheduler) picksOnDevice() bool { return s.bs != nil }

// enter and leave bracket a session's generation: while it generates, a
// step waits (up to Gather) for its tokens.
func (s *scheduler) enter() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

func (s *scheduler) leave() {
	s.mu.Lock()
	s.active--
	s.mu.Unlock()
	s.signal()
}

// crowded reports whether another session than the caller's generates.
func (s *scheduler) crowded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active > 1
}

func (s *scheduler) signal() {
	select {
	case s.arrived <- struct{}{}:
	default:
	}
}

// forward runs ids on st in the scheduler's steps and returns the logits of
// the last one. ctx's cancellation is honoured between steps; on error the
// state may hold part of ids (the caller truncates it). When no step is
// running the caller runs them itself until its own tokens have run (a
// session alone never waits on another goroutine); steps left then go on
// in a goroutine of their own.
func (s *scheduler) forward(ctx context.Context, st model.State, ids []int32) ([]float32, error) {
	r := &batchRequest{ctx: ctx, st: st, ids: ids, done: make(chan struct{})}
	s.run(r)
	return r.logits, r.err
}

// forwardPick is forward where the device picks the next token with p's
// options (picksOnDevice) and only its id comes back.
func (s *scheduler) forwardPick(ctx context.Context, st model.State, ids []int32, p backend.SamplePick) (int, error) {
	r := &batchRequest{ctx: ctx, st: st, ids: ids, pick: &p, done: make(chan struct{})}
	s.run(r)
	return r.id, r.err
}

// run queues r and returns once it is done.
func (s *scheduler) run(r *batchRequest) {
	s.mu.Lock()
	s.queue = append(s.queue, r)
	lead := !s.running
	s.running = true
	s.mu.Unlock()
	if lead {
		s.loop(r)
	} else {
		s.signal()
	}
	<-r.done
}

// Stats returns the counts.
func (s *scheduler) Stats() BatchStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Active, st.Queued = s.active, len(s.queue)
	return st
}

// loop runs steps while requests are queued, then ends; with mine set, it
// ends once mine is done too, passing the steps left to a new goroutine.
// Once mine is done it does not gather: mine's session cannot queue its
// next tokens before its goroutine leaves the loop, so a gather for every
// active session would wait out Gather whenever another session had
// queued already.
func (s *scheduler) loop(mine *batchRequest) {
	for {
		t0 := time.Now()
		if mine == nil || !closed(mine.done) {
			s.gather()
		}
		t1 := time.Now()
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		if mine != nil && closed(mine.done) {
			s.mu.Unlock()
			go s.loop(nil)
			return
		}
		reqs, toks := s.pick()
		t2 := time.Now()
		s.times.gather += t1.Sub(t0)
		s.times.pick += t2.Sub(t1)
		s.mu.Unlock()
		if len(reqs) > 0 {
			s.step(reqs, toks, t2)
		}
	}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// gather waits until every active session has queued its tokens, or
// Gather has passed since the wait began.
func (s *scheduler) gather() {
	var deadline <-chan time.Time
	for {
		s.mu.Lock()
		ready := len(s.queue) > 0 && len(s.queue) >= min(s.active, s.opts.MaxSequences)
		empty := len(s.queue) == 0
		s.mu.Unlock()
		if ready || empty || s.opts.Gather < 0 {
			return
		}
		if deadline == nil {
			t := time.NewTimer(s.opts.Gather)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-s.arrived:
		case <-deadline:
			s.mu.Lock()
			s.waited++
			s.mu.Unlock()
			return
		}
	}
}

// pick takes the requests of the next step and the tokens each runs in it:
// cancelled requests end; decode tokens (requests with one token left) go
// first, then prompt chunks, oldest first, within StepTokens and
// MaxSequences, and within the free blocks of a paged cache: a request
// whose tokens need more blocks than are left waits for a later step,
// unless no request can run: the first held back then runs, and fails with
// model.ErrNoBlocks (there is no preemption). s.mu is held.
func (s *scheduler) pick() ([]*batchRequest, [][]int32) {
	var reqs []*batchRequest
	var toks [][]int32
	budget := s.opts.StepTokens
	blocks := map[*model.PagedCache]int{} // free blocks left of each cache
	var held *batchRequest                // the first request held back for blocks
	var heldN int
	fits := func(r *batchRequest, n int) bool {
		pc := model.PagedCacheOf(r.st)
		if pc == nil {
			return true
		}
		left, ok := blocks[pc]
		if !ok {
			left = pc.FreeBlocks()
		}
		need := pc.Need(r.st, n)
		if need > left {
			if held == nil {
				held, heldN = r, n
			}
			return false
		}
		blocks[pc] = left - need
		return true
	}
	live := s.queue[:0]
	for _, r := range s.queue {
		if err := r.ctx.Err(); err != nil {
			r.err = err
			close(r.done)
			continue
		}
		live = append(live, r)
	}
	clear(s.queue[len(live):])
	s.queue = live
	for pass := 0; pass < 2; pass++ {
		for _, r := range s.queue {
			left := len(r.ids) - r.ran
			if (pass == 0) != (left == 1) || budget == 0 || len(reqs) == s.opts.MaxSequences {
				continue
			}
			n := min(left, budget)
			if !fits(r, n) {
				continue
			}
			budget -= n
			reqs = append(reqs, r)
			toks = append(toks, r.ids[r.ran:r.ran+n])
		}
	}
	if len(reqs) == 0 && held != nil {
		return []*batchRequest{held}, [][]int32{held.ids[held.ran : held.ran+heldN]}
	}
	return reqs, toks
}

// step runs one batched forward pass and ends the requests it completes;
// start is when its requests were picked.
func (s *scheduler) step(reqs []*batchRequest, toks [][]int32, start time.Time) {
	sts := make([]model.State, len(reqs))
	rows := 0
	prefill := false
	for i, r := range reqs {
		sts[i] = r.st
		rows += len(toks[i])
		prefill = prefill || len(toks[i]) > 1
	}
	var ph stepPhases
	var rowOf func(i int) []float32 // request i's logits
	var ids []int
	var pickErr []error // a request's own pick's error
	var err error
	if picks := s.picks(reqs, toks); picks != nil {
		var host [][]float32
		host, ids, pickErr, err = s.forwardDevice(reqs, sts, toks, picks, &ph)
		rowOf = func(i int) []float32 { return host[i] }
	} else {
		var logits []float32
		t := time.Now()
		logits, err = s.bf.ForwardBatch(context.Background(), sts, toks)
		ph.queue = time.Since(t)
		rowOf = func(i int) []float32 { return logits[i*s.vocab : (i+1)*s.vocab : (i+1)*s.vocab] }
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fin := time.Now()
	defer func() {
		end := time.Now()
		t := &s.times
		t.queue += ph.queue
		t.sample += ph.sample
		t.read += ph.read
		t.sync += ph.sync
		t.finish += end.Sub(fin)
		if prefill {
			t.prefillSteps++
			t.prefillSeqs += int64(len(reqs))
			t.prefillRows += int64(rows)
			t.prefillWall += end.Sub(start)
		} else {
			t.decodeSteps++
			t.decodeSeqs += int64(len(reqs))
			t.decodeWall += end.Sub(start)
		}
	}()
	s.stats.Steps++
	s.stats.Rows += int64(rows)
	s.stats.Sequences += int64(len(reqs))
	s.stats.LastBatch = len(reqs)
	finished := make(map[*batchRequest]bool, len(reqs))
	for i, r := range reqs {
		r.ran += len(toks[i])
		switch {
		case err != nil:
			r.err = err
		case pickErr != nil && pickErr[i] != nil:
			r.err = pickErr[i]
		case r.ran == len(r.ids) && r.pick != nil:
			r.id = ids[i]
		case r.ran == len(r.ids):
			r.logits = rowOf(i)
		default:
			continue
		}
		finished[r] = true
		close(r.done)
	}
	live := s.queue[:0]
	for _, r := range s.queue {
		if !finished[r] {
			live = append(live, r)
		}
	}
	clear(s.queue[len(live):])
	s.queue = live
}

// picks returns, for a step whose requests ask the device to pick a token
// once it has run (and picksOnDevice), each request's pick (the zero value
// for the others); nil when no request of the step ends in a device pick.
func (s *scheduler) picks(reqs []*batchRequest, toks [][]int32) []backend.SamplePick {
	if s.bs == nil {
		return nil
	}
	var picks []backend.SamplePick
	for i, r := range reqs {
		if r.pick != nil && r.ran+len(toks[i]) == len(r.ids) {
			if picks == nil {
				picks = make([]backend.SamplePick, len(reqs))
			}
			picks[i] = *r.pick
		}
	}
	return picks
}

// forwardDevice runs the step leaving the logits on the device, picks
// there the tokens of the requests that end in a pick (ids, by request)
// and reads back the logits of the others that end (host, by request; nil
// for the rest). When the picks fail (a NaN logit), each is tried alone,
// so that only those that fail get their error (pickErr, by request).
func (s *scheduler) forwardDevice(reqs []*batchRequest, sts []model.State, toks [][]int32, picks []backend.SamplePick, ph *stepPhases) (host [][]float32, ids []int, pickErr []error, err error) {
	t := time.Now()
	dev, err := s.dbf.ForwardBatchDevice(context.Background(), sts, toks)
	ph.queue = time.Since(t)
	if err != nil {
		return nil, nil, nil, err
	}
	var rows []backend.SamplePick
	var at []int // the request of each of rows
	host = make([][]float32, len(reqs))
	t = time.Now()
	for i, r := range reqs {
		switch {
		case r.ran+len(toks[i]) != len(r.ids): // more chunks to run
		case r.pick != nil:
			p := picks[i]
			p.Row = i
			rows, at = append(rows, p), append(at, i)
		default:
			host[i] = make([]float32, s.vocab)
			s.b.Read(host[i], dev, i*s.vocab)
		}
	}
	t1 := time.Now()
	ph.read = t1.Sub(t)
	got := make([]int, len(rows))
	if err := s.bs.SampleTokens(got, dev, s.vocab, rows); err != nil {
		pickErr = make([]error, len(reqs))
		for j, i := range at {
			pickErr[i] = s.bs.SampleTokens(got[j:j+1], dev, s.vocab, rows[j:j+1])
		}
	}
	ids = make([]int, len(reqs))
	for j, i := range at {
		ids[i] = got[j]
	}
	t2 := time.Now()
	ph.sample = t2.Sub(t1)
	err = s.b.Sync()
	ph.sync = time.Since(t2)
	return host, ids, pickErr, err
}

// stepPhases are the phases of one step (stepTimes).
type stepPhases struct{ queue, sample, read, sync time.Duration }

// stepTimes returns the time split since Load.
func (s *scheduler) stepTimes() stepTimes {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.times
}
