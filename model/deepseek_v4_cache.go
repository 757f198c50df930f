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
	scratch   v4Scratch
	hostIdx   []int32
	hostW     []float32
	hostLog   []float32
	expRows   [][]int32
	expScale  [][]float32
	mtp       *v4MTPState // nil without an MTP block (mtp.go)
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
	qres, q, att, u                backend.Buffer
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
	m.growState(s, 1)
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

// growState makes the per-chunk buffers hold n new rows.
func (m *DeepseekV4) growState(s *v4State, n int) {
	if s.rows >= n {
		return
	}
	b, v, cfg := m.b, m.v, m.cfg
	D, nh, H, hd := cfg.HiddenSize, v.HCMult, cfg.NumHeads, v.HeadDim
	for i := range s.layers {
		ls := &s.layers[i]
		// Local rows: window tail (sliding_window-1), n new rows and as many
		// again as the window (the slack the tail moves through).
		rows := 2*s.window() - 1 + n
		for j := range ls.local {
			nb := b.NewBuffer(rows * hd)
			if ls.local[j] != nil && j == ls.cur && ls.win > 0 {
				b.Copy(b.View(nb, 0, ls.win*hd), b.View(ls.local[j], ls.start*hd, ls.win*hd))
			}
			ls.local[j] = nb
		}
		ls.start, ls.capRows = 0, n
		for _, c := range []*v4Comp{ls.comp, ls.index} {
			if c == nil {
				continue
			}
			rate := m.blocks[i].rate
			// Previous window + tail (< rate) + new rows + the slack the
			// kept rows move through (at least v4CompSlack rows, a window).
			rows := 2*rate + n + max(rate, min(v4CompSlack, 4*rate))
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
	mix := m.mixer.Config().MixDim()
	sc := &s.scratch
	sc.x = b.NewBuffer(n * nh * D)
	sc.emb = b.NewBuffer(n * D)
	sc.c = b.NewBuffer(n * D)
	sc.h = b.NewBuffer(n * D)
	sc.a = b.NewBuffer(n * D)
	sc.logits = b.NewBuffer(n * mix)
	sc.pre = b.NewBuffer(n * nh)
	sc.post = b.NewBuffer(n * nh)
	sc.res = b.NewBuffer(n * nh * nh)
	sc.qres = b.NewBuffer(n * v.QLoraRank)
	sc.q = b.NewBuffer(n * H * hd)
	sc.att = b.NewBuffer(n * H * hd)
	sc.u = b.NewBuffer(n * v.OGroups * v.OLoraRank)
	if slices.Contains(v.LayerTypes, v4CSA) {
		sc.iq = b.NewBuffer(n * v.IndexNHeads * v.IndexHeadDim)
		sc.iw = b.NewBuffer(n * v.IndexNHeads)
		sc.idx = b.NewBuffer(n * s.indexTopK())
	}
	sc.router = b.NewBuffer(n * v.NRoutedExperts)
	sc.xe = b.NewBuffer(n * D)
	sc.ge = b.NewBuffer(n * v.MoEIntermediateSize)
	sc.ue = b.NewBuffer(n * v.MoEIntermediateSize)
	sc.ye = b.NewBuffer(n * D)
	sc.sg = b.NewBuffer(n * v.MoEIntermediateSize)
	sc.su = b.NewBuffer(n * v.MoEIntermediateSize)
	sc.moeOut = b.NewBuffer(n * D)
	sc.headLogits = b.NewBuffer(n * nh)
	sc.final = b.NewBuffer(n * D)
	sc.finalLogits = b.NewBuffer(n * cfg.VocabSize)
	s.hostLog = make([]float32, n*v.NRoutedExperts)
	s.hostIdx = make([]int32, n*v.NumExpertsPerTok)
	s.hostW = make([]float32, n*v.NumExpertsPerTok)
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
