package kernels

// The fusion pass. Every queued operation whose memory effects are known
// (effects: the device ranges it reads and writes) can be moved past its
// neighbours when neither depends on the other, so an operation that can
// join an earlier one (a matmul of the same input, a RoPE with the same
// positions, an epilogue of a matmul) does so wherever that one sits among
// the last fuseWindow queued operations, not only when it was queued right
// after it. Model code thus queues its ops in the order of the math, and the
// launches come out as if it had ordered them for the GPU. An operation with
// unknown effects (a kernel queued through enqueue without them) fences the
// pass: nothing moves past it.

// effects are the device memory ranges an operation reads and writes
// (weights, which nothing writes during a step, are left out).
type effects struct{ reads, writes []span }

// conflicts reports whether a and c cannot be swapped: one writes what the
// other reads or writes.
func (a *effects) conflicts(c *effects) bool {
	for _, w := range a.writes {
		if anyOverlap(w, c.reads) || anyOverlap(w, c.writes) {
			return true
		}
	}
	for _, w := range c.writes {
		if anyOverlap(w, a.reads) {
			return true
		}
	}
	return false
}

func anyOverlap(s span, ts []span) bool {
	for _, t := range ts {
		if s.overlaps(t) {
			return true
		}
	}
	return false
}

// fuseWindow is how many of the newest queued operations the pass looks
// back over; launched ahead, a queue keeps this many unlaunched (push).
const fuseWindow = 12

// effectsOf returns what o reads and writes, or nil when that is unknown.
func (o *op) effectsOf() *effects {
	switch {
	case o.gemv != nil:
		g := o.gemv
		fx := &effects{reads: []span{g.x}}
		if g.xs != 0 { // strided groups: every group's row of x
			fx.reads[0] = span{g.x.ptr, g.x.ptr + uint64(4*g.xs*(len(g.groups)-1)) + (g.x.end - g.x.ptr)}
		}
		for _, gg := range g.groups {
			fx.writes = append(fx.writes, gg.y)
		}
		if g.mode == 2 {
			fx.reads, fx.writes = append(fx.reads, g.res), append(fx.writes, g.res)
		}
		if nm := g.norm; nm != nil {
			fx.reads, fx.writes = append(fx.reads, nm.x, nm.w), append(fx.writes, nm.dst)
		}
		return fx
	case o.rope != nil:
		r := o.rope
		fx := &effects{reads: []span{r.x1}, writes: []span{r.x1}}
		if r.x2.ptr != 0 {
			fx.reads, fx.writes = append(fx.reads, r.x2), append(fx.writes, r.x2)
		}
		return fx
	case o.norm != nil:
		nm := o.norm
		return &effects{reads: []span{nm.x, nm.w}, writes: []span{nm.dst}}
	case o.kind == opCopy:
		dst, src, n := o.params[0], o.params[1], o.params[2]
		return &effects{reads: []span{{src, src + n}}, writes: []span{{dst, dst + n}}}
	}
	return o.fx
}

// movable reports whether an operation with effects fx can run at position
// i+1 of the queue instead of at its end, i.e. before every operation queued
// after op i (hoisting it next to op i): each of those has known effects
// that do not conflict with fx. qmu held.
func (b *Backend) movable(i int, fx *effects) bool {
	for _, o := range b.q.ops[i+1:] {
		ofx := o.effectsOf()
		if ofx == nil || ofx.conflicts(fx) {
			return false
		}
	}
	return true
}

// sinkable reports whether op i can run after every operation queued after
// it instead (so that the op queued next may join it at the queue's end).
// qmu held.
func (b *Backend) sinkable(i int) bool {
	fx := b.q.ops[i].effectsOf()
	return fx != nil && b.movable(i, fx)
}

// sink moves op i to the end of the queue (sinkable said it may). qmu held.
func (b *Backend) sink(i int) {
	q := &b.q
	o := q.ops[i]
	copy(q.ops[i:], q.ops[i+1:])
	q.ops[len(q.ops)-1] = o
}

// candidates returns the positions of the queued operations the pass may
// join a new one to, newest first. qmu held.
func (b *Backend) candidates() []int {
	n := len(b.q.ops)
	idx := b.candBuf[:0]
	for i := n - 1; i >= 0 && i >= n-fuseWindow; i-- {
		idx = append(idx, i)
	}
	b.candBuf = idx
	return idx
}

// fxOf is the effects of a kernel that reads reads and writes writes.
func fxOf(writes []*Buffer, reads ...*Buffer) *effects {
	fx := &effects{}
	for _, w := range writes {
		fx.writes = append(fx.writes, spanOf(w))
	}
	for _, r := range reads {
		fx.reads = append(fx.reads, spanOf(r))
	}
	return fx
}
