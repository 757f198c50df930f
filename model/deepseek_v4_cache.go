package model

import (
	"fmt"
	"math"
	"slices"

	"github.com/manifoldlm/manifold/backend"
)

// DeepSeek-V4's per-sequence state: each layer's sliding window, its
// compressors' pending rows and compressed entries in ping-pong ring
// buffers, and the snapshots that let a failed or cancelled forward pass
// rewind them. The forward pass (deepseek_v4.go) reads and appends through
// these; nothing here computes the model's math.

// v4Comp is one compressor's per-sequence state: the source rows not yet
// compressed (and, for CSA, the last compressed window, whose Ca halves feed
// the next entry) and the compressed entries.
type v4Comp struct {
	// kv and gate hold the source rows [prev | tail | new] from row start of
	// buffer cur; the kept rows move to the other buffer's front only when a
	// call's new rows would pass the end (as v4LayerState's window).
	kv, gate  [2]backend.Buffer
	cur       int
	start     int
	capRows   int
	prev      int // rows of the previous window kept at the front (CSA: 0 or rate)
	tail      int // rows after it, fewer than rate
	entries   backend.Buffer
	count     int // entries emitted
	maxCount  int
	rowWidth  int
	entryCols int
}

// v4LayerState is one layer's cache.
type v4LayerState struct {
	// local holds the sliding window's rows of head_dim: rows [start,
	// start+win) of local[cur] are the window tail, and each call appends its
	// new rows after them. Only when they would pass the buffer's end is the
	// tail moved, to the front of the other buffer (ping-pong, so that the
	// state before the call stays intact): with sliding_window rows of slack,
	// once every sliding_window tokens in decode instead of every step.
	local   [2]backend.Buffer
	cur     int
	start   int
	capRows int // rows of new tokens the local buffers hold beyond the window
	win     int // window rows held (at most sliding_window-1+extra)
	extra   int // rows kept beyond the window so that a rollback keeps a whole window (the MTP block's)
	comp    *v4Comp
	index   *v4Comp
}

// growLocal makes the local buffers rows of hd each, the window tail moved
// to the front of the current one, with room for n new rows past it.
func (ls *v4LayerState) growLocal(b backend.Backend, rows, hd, n int) {
	for j := range ls.local {
		nb := b.NewBuffer(rows * hd)
		if ls.local[j] != nil && j == ls.cur && ls.win > 0 {
			b.Copy(b.View(nb, 0, ls.win*hd), b.View(ls.local[j], ls.start*hd, ls.win*hd))
		}
		ls.local[j] = nb
	}
	ls.start, ls.capRows = 0, n
}

// indexTopK is the number of compressed entries each CSA query keeps:
// index_topk, or the state's capacity when that is smaller (no context it
// holds has more entries; the selection is the same, and the index scratch
// is not sized by an index_topk far past any context).
func (s *v4State) indexTopK() int { return min(s.m.v.IndexTopK, s.cap) }

// window is the sliding window: sliding_window, or the state's capacity
// when that is smaller (every position it holds is then in the window, as
// with the configured one, and the local buffers are not sized past it).
func (s *v4State) window() int { return min(s.m.v.SlidingWindow, s.cap) }

type v4State struct {
	m    *DeepseekV4
	cap  int
	hist []int32 // the tokens of every position, so a rewind can replay them
	done int     // positions in the caches (hist[done:] awaits replay)
	// snap is the cache state before the last forward call, which the
	// ping-pong buffers still hold: restoring it rewinds that call for free.
	snap      v4Snap
	snapValid bool
	layers    []v4LayerState
	rows      int // scratch rows
	logitRows int // rows of scratch.finalLogits (forward allocates those asked for)
	scratch   v4Scratch
	hostIdx   []int32
	hostW     []float32
	hostLog   []float32
	expRows   [][]int32
	expScale  [][]float32
	host      v4HostScratch // the host experts' scratch (offload.go), when the model has some
	hostOff   []int
	mtp       *v4MTPState // nil without an MTP block (mtp.go)
	// Tokens run while held on the device (ForwardSampled): heldIDs
	// records the id of position p in slot p % v4HeldRing, heldAt lists the
	// positions (increasing) whose hist entry awaits its record
	// (resolveHeld), heldHash [K] takes a hash-routed layer's picks.
	heldIDs, heldHash backend.Buffer
	heldAt            []int
}

// v4HeldRing is the slots of a state's record of held tokens: a read of
// the record (which waits for the device) once in this many positions
// keeps it from growing with the context.
const v4HeldRing = 1024

// resolveHeld fills in the hist entries of the tokens run while held from
// their record on the device (a read, which waits for the steps that
// wrote it): before anything reads hist beyond the token just run (a
// replay, a draft), and before a record would take the slot of one not
// yet read.
func (s *v4State) resolveHeld() {
	if len(s.heldAt) == 0 {
		return
	}
	v := make([]float32, v4HeldRing)
	s.m.b.Read(v, s.heldIDs, 0)
	for _, p := range s.heldAt {
		s.hist[p] = max(int32(math.Float32bits(v[p%v4HeldRing])), 0) // a NaN pick (-1-id) ran as token 0
	}
	s.heldAt = s.heldAt[:0]
}

// v4Snap is the bookkeeping of a cache state (the data stays in the buffers).
type v4Snap struct {
	done   int
	layers []v4LayerSnap
}

type v4LayerSnap struct {
	cur, start, win int
	comp, index     v4CompSnap
}

type v4CompSnap struct{ cur, start, prev, tail, count int }

func (c *v4Comp) snap() v4CompSnap {
	if c == nil {
		return v4CompSnap{}
	}
	return v4CompSnap{c.cur, c.start, c.prev, c.tail, c.count}
}

func (c *v4Comp) restore(v v4CompSnap) {
	if c != nil {
		c.cur, c.start, c.prev, c.tail, c.count = v.cur, v.start, v.prev, v.tail, v.count
	}
}

// takeSnap records the current cache state before a forward call.
func (s *v4State) takeSnap() {
	if s.snap.layers == nil {
		s.snap.layers = make([]v4LayerSnap, len(s.layers))
	}
	s.snap.done = s.done
	for i := range s.layers {
		ls := &s.layers[i]
		s.snap.layers[i] = v4LayerSnap{cur: ls.cur, start: ls.start, win: ls.win, comp: ls.comp.snap(), index: ls.index.snap()}
	}
	s.snapValid = true
}

// restoreSnap rewinds the caches to the state before the last forward call.
func (s *v4State) restoreSnap() {
	s.done = s.snap.done
	for i := range s.layers {
		ls, v := &s.layers[i], s.snap.layers[i]
		ls.cur, ls.start, ls.win = v.cur, v.start, v.win
		ls.comp.restore(v.comp)
		ls.index.restore(v.index)
	}
}

// reset empties the caches.
func (s *v4State) reset() {
	s.done, s.snapValid = 0, false
	for i := range s.layers {
		ls := &s.layers[i]
		ls.start, ls.win = 0, 0
		ls.comp.restore(v4CompSnap{cur: ls.comp.snap().cur})
		ls.index.restore(v4CompSnap{cur: ls.index.snap().cur})
	}
}

type v4Scratch struct {
	x, emb, c, h, a                backend.Buffer
	logits, pre, post, res         backend.Buffer
	qres, qn, q, att, u            backend.Buffer
	iq, iw, idx                    backend.Buffer
	router, xe, ge, ue, ye, sg, su backend.Buffer
	out                            backend.Buffer
	headLogits, final, finalLogits backend.Buffer
	moeOut                         backend.Buffer
}

func (s *v4State) Len() int { return len(s.hist) }
func (s *v4State) Cap() int { return s.cap }

// Truncate keeps the first n positions. Into the last forward call the
// caches are cut in place (cut: its buffers still hold the rows before the
// cut, and the compressors' state after n positions follows from n), as
// speculative decoding's rollback of its rejected drafts needs. Further
// back the compressed caches cannot be cut (the reference marks V4 as
// stateful for that reason): the caches are emptied and the tokens before
// n replayed by the next Forward, so a rewind costs at most a re-prefill,
// never a wrong answer.
func (s *v4State) Truncate(n int) {
	n = max(n, 0)
	if n >= len(s.hist) {
		return
	}
	if n < s.done {
		if !(s.snapValid && n >= s.snap.done && s.cut(n)) {
			s.reset()
		}
	}
	s.hist = s.hist[:n]
	s.heldAt = slices.DeleteFunc(s.heldAt, func(p int) bool { return p >= n })
	if s.mtp != nil {
		s.mtp.saved.truncate(n)
		s.mtp.truncate(n - 1) // the entry of position p pairs it with token p+1
	}
}

// cut rolls the caches back to their first n positions, inside the last
// forward call (n >= snap.done): the buffers still hold the rows before
// the cut, so the sliding windows end there, and each compressor keeps
// the entries of the windows closed before it and, as pending rows, the
// rows after them (the last closed window's too, for CSA). It reports
// false, changing nothing, where a buffer lacks a row it needs (never
// within the last call, whose slide keeps the rows before it).
func (s *v4State) cut(n int) bool {
	back := s.done - n
	for i := range s.layers {
		ls := &s.layers[i]
		if ls.start+ls.win-back < min(s.window()-1, n) {
			return false
		}
		blk := &s.m.blocks[i]
		if !ls.comp.canCut(n, back, blk.rate, blk.Comp) || (blk.Indexer != nil && !ls.index.canCut(n, back, blk.rate, blk.Indexer.Comp)) {
			return false
		}
	}
	for i := range s.layers {
		ls := &s.layers[i]
		end := ls.start + ls.win - back
		keep := min(s.window()-1, n)
		ls.start, ls.win = end-keep, keep
		blk := &s.m.blocks[i]
		ls.comp.cut(n, back, blk.rate, blk.Comp)
		if blk.Indexer != nil {
			ls.index.cut(n, back, blk.rate, blk.Indexer.Comp)
		}
	}
	s.done = n
	return true
}

// cutState is the compressor's state after n positions: entries, the
// kept previous window's rows, the pending rows, and the buffer row where
// they start (back rows before the end of the rows held).
func (c *v4Comp) cutState(n, back, rate int, w *v4Compressor) (count, prev, tail, start int) {
	count = n / rate
	tail = n - count*rate
	if w.csa && count > 0 {
		prev = rate
	}
	start = c.start + c.prev + c.tail - back - prev - tail
	return count, prev, tail, start
}

func (c *v4Comp) canCut(n, back, rate int, w *v4Compressor) bool {
	if c == nil {
		return true
	}
	count, _, _, start := c.cutState(n, back, rate, w)
	return start >= 0 && count <= c.count
}

func (c *v4Comp) cut(n, back, rate int, w *v4Compressor) {
	if c != nil {
		c.count, c.prev, c.tail, c.start = c.cutState(n, back, rate, w)
	}
}

// CacheBytes is the memory the caches hold (allocated, in bytes).
func (s *v4State) CacheBytes() int64 {
	var n int64
	for i := range s.layers {
		ls := &s.layers[i]
		n += int64(2 * ls.local[0].Len())
		for _, c := range []*v4Comp{ls.comp, ls.index} {
			if c != nil {
				n += int64(2*c.kv[0].Len() + 2*c.gate[0].Len() + c.entries.Len())
			}
		}
	}
	return 4*n + s.mtp.cacheBytes()
}

// CacheBytesPerToken is what each further position adds: the compressed
// entries (head_dim/rate floats per HCA layer, (head_dim + index_head_dim)/rate
// per CSA layer). The sliding window, the compressor tails and the overlap
// windows are bounded and do not grow with the sequence.
func (s *v4State) CacheBytesPerToken() int64 { return s.m.CacheBytesPerToken() }

// CacheBytesPerToken is the cache growth per position, rounded up to a byte.
func (m *DeepseekV4) CacheBytesPerToken() int64 {
	var floats float64
	for _, blk := range m.blocks {
		switch blk.kind {
		case v4HCA:
			floats += float64(m.v.HeadDim) / float64(blk.rate)
		case v4CSA:
			floats += float64(m.v.HeadDim+m.v.IndexHeadDim) / float64(blk.rate)
		}
	}
	return int64(math.Ceil(4 * floats))
}

// NewState allocates the caches for up to capacity positions.
func (m *DeepseekV4) NewState(capacity int) (State, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("model: deepseek_v4 state capacity must be positive, got %d", capacity)
	}
	s := &v4State{m: m, cap: capacity, layers: make([]v4LayerState, len(m.blocks))}
	for i, blk := range m.blocks {
		ls := &s.layers[i]
		if blk.Comp != nil {
			ls.comp = m.newComp(blk.Comp, capacity)
		}
		if blk.Indexer != nil {
			ls.index = m.newComp(blk.Indexer.Comp, capacity)
		}
	}
	if err := m.growState(s, 1); err != nil {
		return nil, fmt.Errorf("model: deepseek_v4: a state of %d positions (about %.2f GiB): %w", capacity, float64(m.StateBytes(capacity))/(1<<30), err)
	}
	if m.mtp != nil {
		s.mtp = &v4MTPState{saved: mtpRows{width: m.v.HCMult * m.cfg.HiddenSize}}
		s.mtp.ls.extra = MaxDraft
	}
	s.expRows = make([][]int32, m.v.NRoutedExperts)
	s.expScale = make([][]float32, m.v.NRoutedExperts)
	return s, nil
}

func (m *DeepseekV4) newComp(c *v4Compressor, capacity int) *v4Comp {
	maxCount := capacity / c.rate
	return &v4Comp{
		entries:   m.b.NewBuffer(max(1, maxCount) * c.width),
		maxCount:  maxCount,
		rowWidth:  c.rowWidth(),
		entryCols: c.width,
	}
}

// growState makes the per-chunk buffers hold n new rows. Where the backend
// could not allocate them (a GPU out of memory: its Sync reports it) the
// caches, whose rows the new buffers were to take over, are emptied, so
// that the next forward pass replays the state's tokens; the error says
// how many rows were asked for.
func (m *DeepseekV4) growState(s *v4State, n int) error {
	if s.rows >= n {
		return nil
	}
	b, v := m.b, m.v
	hd := v.HeadDim
	for i := range s.layers {
		ls := &s.layers[i]
		// Local rows: window tail (sliding_window-1), n new rows and as many
		// again as the window (the slack the tail moves through).
		rows := v4LocalRows(s.window(), n)
		ls.growLocal(b, rows, hd, n)
		for _, c := range []*v4Comp{ls.comp, ls.index} {
			if c == nil {
				continue
			}
			rows := v4CompRows(m.blocks[i].rate, n)
			for j := 0; j < 2; j++ {
				nk, ng := b.NewBuffer(rows*c.rowWidth), b.NewBuffer(rows*c.rowWidth)
				if keep := c.prev + c.tail; c.kv[j] != nil && j == c.cur && keep > 0 {
					b.Copy(b.View(nk, 0, keep*c.rowWidth), b.View(c.kv[j], c.start*c.rowWidth, keep*c.rowWidth))
					b.Copy(b.View(ng, 0, keep*c.rowWidth), b.View(c.gate[j], c.start*c.rowWidth, keep*c.rowWidth))
				}
				c.kv[j], c.gate[j] = nk, ng
			}
			c.start, c.capRows = 0, n
		}
	}
	s.rows = n
	m.scratchSizes(&s.scratch, n, s.indexTopK(), func(p *backend.Buffer, floats int) { *p = b.NewBuffer(floats) })
	s.hostLog = make([]float32, n*v.NRoutedExperts)
	s.hostIdx = make([]int32, n*v.NumExpertsPerTok)
	s.hostW = make([]float32, n*v.NumExpertsPerTok)
	m.growHost(&s.host, n)
	if err := b.Sync(); err != nil {
		s.rows = 0
		s.reset()
		return fmt.Errorf("allocating the caches and the scratch of %d-row passes: %w", n, err)
	}
	return nil
}

// v4LocalRows is the rows of each sliding-window buffer for passes of n
// rows: the window tail (window-1), n new rows and as many again as the
// window (the slack the tail moves through).
func v4LocalRows(window, n int) int { return 2*window - 1 + n }

// v4CompRows is the rows of each compressor source buffer for passes of n
// rows: the previous window and the tail (< rate), n new rows, and the
// slack the kept rows move through (at least v4CompSlack rows, a window).
func v4CompRows(rate, n int) int { return 2*rate + n + max(rate, min(v4CompSlack, 4*rate)) }

// scratchSizes calls f with each per-pass scratch buffer of sc and its
// floats for passes of n rows (index_topk k), as growState allocates them
// and StateBytes counts them.
func (m *DeepseekV4) scratchSizes(sc *v4Scratch, n, k int, f func(*backend.Buffer, int)) {
	v, cfg := m.v, m.cfg
	D, nh, H, hd, I := cfg.HiddenSize, v.HCMult, cfg.NumHeads, v.HeadDim, v.MoEIntermediateSize
	mix := m.mixer.Config().MixDim()
	for _, b := range []struct {
		p      *backend.Buffer
		floats int
	}{
		{&sc.x, n * nh * D}, {&sc.emb, n * D}, {&sc.c, n * D}, {&sc.h, n * D}, {&sc.a, n * D},
		{&sc.logits, n * mix}, {&sc.pre, n * nh}, {&sc.post, n * nh}, {&sc.res, n * nh * nh},
		{&sc.qres, n * v.QLoraRank}, {&sc.qn, n * v.QLoraRank}, {&sc.q, n * H * hd}, {&sc.att, n * H * hd}, {&sc.u, n * v.OGroups * v.OLoraRank},
		{&sc.router, n * v.NRoutedExperts}, {&sc.xe, n * D}, {&sc.ge, n * I}, {&sc.ue, n * I}, {&sc.ye, n * D},
		{&sc.sg, n * I}, {&sc.su, n * I}, {&sc.moeOut, n * D},
		{&sc.headLogits, n * nh}, {&sc.final, n * D},
	} {
		f(b.p, b.floats)
	}
	if slices.Contains(v.LayerTypes, v4CSA) {
		f(&sc.iq, n*v.IndexNHeads*v.IndexHeadDim)
		f(&sc.iw, n*v.IndexNHeads)
		f(&sc.idx, n*k)
	}
}

// cacheFloats is the floats of the caches (as CacheBytes counts them,
// without the MTP block's) of a state of capacity positions whose buffers
// hold passes of rows rows.
func (m *DeepseekV4) cacheFloats(capacity, rows int) int64 {
	window := min(m.v.SlidingWindow, capacity)
	var n int64
	for _, blk := range m.blocks {
		n += int64(2 * v4LocalRows(window, rows) * m.v.HeadDim)
		for _, c := range []*v4Compressor{blk.Comp, indexComp(blk.Indexer)} {
			if c != nil {
				n += int64(4*v4CompRows(c.rate, rows)*c.rowWidth() + max(1, capacity/c.rate)*c.width)
			}
		}
	}
	return n
}

func indexComp(ix *v4Indexer) *v4Compressor {
	if ix == nil {
		return nil
	}
	return ix.Comp
}

// StateBytes is the memory a state of capacity positions takes once it
// has run a prompt: its caches (the compressed entries of every position
// it may hold, the sliding windows and the compressors' pending rows, which
// do not grow with it) and the scratch of its largest forward pass (the
// engine's prefill chunk, at most chunkMax rows: the indexer's scores
// and a GPU's top-k scratch included), the MTP block's rows included. The engine checks it against the backend's memory before
// NewState allocates.
func (m *DeepseekV4) StateBytes(capacity int) int64 {
	if capacity <= 0 {
		return 0
	}
	rows := min(chunkMax, capacity)
	floats := m.cacheFloats(capacity, rows)
	var sc v4Scratch
	m.scratchSizes(&sc, rows, min(m.v.IndexTopK, capacity), func(_ *backend.Buffer, f int) { floats += int64(f) })
	floats += int64(m.cfg.VocabSize)                                       // the last row's logits (a Forward asking for every row's holds more)
	floats += v4HeldRing + int64(m.v.NumExpertsPerTok)                     // the record of held tokens and their hashed picks (ForwardSampled)
	host := int64(rows) * int64(m.v.NRoutedExperts+2*m.v.NumExpertsPerTok) // routing on the host
	for _, blk := range m.blocks {
		if blk.Indexer != nil {
			// A pass's indexer scores and the top-k scratch a GPU holds with them.
			floats += 4 * min(int64(chunkScoreBudget), int64(rows)*int64(max(1, capacity/blk.rate)))
			break
		}
	}
	if m.mtp != nil {
		// Its saved streams (window + a pass), its window buffers and scratch.
		w, D := min(m.v.SlidingWindow, capacity), int64(m.v.HCMult*m.cfg.HiddenSize)
		floats += 2*int64(w+rows)*D + int64(2*v4LocalRows(w, rows)*m.v.HeadDim) + int64(rows)*(2*D+int64(m.cfg.HiddenSize)) + int64(m.cfg.VocabSize)
	}
	return 4*(floats+host) + m.hostStateBytes(rows)
}

// slide makes room for n new rows of width floats after the keep rows at
// row start of the ping-pong buffers cur: where they would pass the end, the
// kept rows of every pair move to the front of the other buffer (the state
// before the call stays in this one). It returns the buffer and start row to
// use.
func (m *DeepseekV4) slide(cur, start, keep, n, width int, pairs ...*[2]backend.Buffer) (int, int) {
	if width*(start+keep+n) <= pairs[0][cur].Len() {
		return cur, start
	}
	if keep > 0 {
		for _, p := range pairs {
			m.b.Copy(m.b.View(p[1-cur], 0, keep*width), m.b.View(p[cur], start*width, keep*width))
		}
	}
	return 1 - cur, 0
}

// v4CompSlack bounds the rows a compressor's buffers hold beyond what a call
// needs (a window, or up to four of the shorter ones): in decode the kept
// rows move to the other buffer once every four windows (CSA, rate 4: every
// 16th token instead of every fourth) or every second window.
const v4CompSlack = 32
