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
// (weights, which nothing writes during a step, are left out): a value of
// fixed size, so that the pass, which asks for them while ops are queued,
// allocates nothing. The zero value is "unknown".
type effects struct {
	known         bool
	nr, nw        uint8
	reads, writes [maxSpans]span
}

// maxSpans bounds an op's read and written ranges: a fused matmul reads x,
// the residual and a norm's input and weight, and writes up to three
// outputs, the residual and the norm's output.
const maxSpans = 6

func (e *effects) read(ss ...span) {
	e.known = true
	for _, s := range ss {
		e.reads[e.nr] = s
		e.nr++
	}
}

func (e *effects) write(ss ...span) {
	e.known = true
	for _, s := range ss {
		e.writes[e.nw] = s
		e.nw++
	}
}

// conflicts reports whether a and c cannot be swapped: one writes what the
// other reads or writes.
func (a *effects) conflicts(c *effects) bool {
	for _, w := range a.writes[:a.nw] {
		if anyOverlap(w, c.reads[:c.nr]) || anyOverlap(w, c.writes[:c.nw]) {
			return true
		}
	}
	for _, w := range c.writes[:c.nw] {
		if anyOverlap(w, a.reads[:a.nr]) {
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

// effectsOf returns what o reads and writes (not known: anything).
func (o *op) effectsOf() effects {
	var fx effects
	switch {
	case o.gemv != nil:
		g := o.gemv
		x := g.x
		if g.xs != 0 { // strided groups: every group's row of x
			x.end = g.x.ptr + uint64(4*g.xs*(len(g.groups)-1)) + (g.x.end - g.x.ptr)
		}
		fx.read(x)
		for _, gg := range g.groups {
			fx.write(gg.y)
		}
		if g.mode == 2 {
			fx.read(g.res)
			fx.write(g.res)
		}
		if nm := g.norm; nm != nil {
			fx.read(nm.x, nm.w)
			fx.write(nm.dst)
		}
	case o.rope != nil:
		r := o.rope
		fx.read(r.x1)
		fx.write(r.x1)
		if r.x2.ptr != 0 {
			fx.read(r.x2)
			fx.write(r.x2)
		}
	case o.norm != nil:
		nm := o.norm
		fx.read(nm.x, nm.w)
		fx.write(nm.dst)
	case o.kind == opCopy:
		dst, src, n := o.params[0], o.params[1], o.params[2]
		fx.read(span{src, src + n})
		fx.write(span{dst, dst + n})
	default:
		fx = o.fx
	}
	return fx
}

// movable reports whether an operation with effects fx can run at position
// i+1 of the queue instead of at its end, i.e. before every operation queued
// after op i (hoisting it next to op i): each of those has known effects
// that do not conflict with fx. qmu held.
func (b *Backend) movable(i int, fx *effects) bool {
	for k := i + 1; k < len(b.q.ops); k++ {
		ofx := b.q.ops[k].effectsOf()
		if !ofx.known || ofx.conflicts(fx) {
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
	return fx.known && b.movable(i, &fx)
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

// fxOf is the effects of a kernel that writes writes and reads reads.
func fxOf(writes []*Buffer, reads ...*Buffer) effects {
	var fx effects
	for _, w := range writes {
		fx.write(spanOf(w))
	}
	for _, r := range reads {
		fx.read(spanOf(r))
	}
	return fx
}
