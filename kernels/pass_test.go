package kernels

import "testing"

// TestFusionPassMoves checks the pass's rule on a hand-made queue: an
// operation may move past those whose effects are known and disjoint from
// its own; unknown effects fence.
func TestFusionPassMoves(t *testing.T) {
	sp := func(lo, hi uint64) span { return span{lo, hi} }
	fx := func(r, w span) *effects {
		var e effects
		e.read(r)
		e.write(w)
		return &e
	}
	known := func(r, w span) op { return op{fx: *fx(r, w)} }
	for _, tc := range []struct {
		name  string
		after []op     // queued after position 0
		fx    *effects // the op that would move to position 1
		want  bool
	}{
		{"disjoint", []op{known(sp(100, 200), sp(300, 400))}, fx(sp(0, 50), sp(500, 600)), true},
		{"reads what moves writes", []op{known(sp(500, 520), sp(300, 400))}, fx(sp(0, 50), sp(500, 600)), false},
		{"writes what moves reads", []op{known(sp(100, 200), sp(40, 60))}, fx(sp(0, 50), sp(500, 600)), false},
		{"both write", []op{known(sp(100, 200), sp(590, 700))}, fx(sp(0, 50), sp(500, 600)), false},
		{"both read", []op{known(sp(0, 50), sp(300, 400))}, fx(sp(0, 50), sp(500, 600)), true},
		{"unknown effects fence", []op{{}}, fx(sp(0, 50), sp(500, 600)), false},
		{"adjacent ranges", []op{known(sp(100, 200), sp(600, 700))}, fx(sp(0, 50), sp(500, 600)), true},
	} {
		b := &Backend{}
		b.q.ops = append([]op{known(sp(1000, 1100), sp(1200, 1300))}, tc.after...)
		if got := b.movable(0, tc.fx); got != tc.want {
			t.Errorf("%s: movable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestFusionPassSink checks that an operation sinks to the end only past
// independent ones, keeping the order of the others.
func TestFusionPassSink(t *testing.T) {
	b := &Backend{}
	q := func(name string, r, w span) op {
		var e effects
		e.read(r)
		e.write(w)
		return op{name: name, fx: e}
	}
	b.q.ops = []op{q("a", span{0, 8}, span{0, 8}), q("b", span{16, 24}, span{16, 24}), q("c", span{32, 40}, span{32, 40})}
	if !b.sinkable(0) {
		t.Fatal("a should sink past b and c")
	}
	b.sink(0)
	var got string
	for _, o := range b.q.ops {
		got += o.name
	}
	if got != "bca" {
		t.Errorf("after sink: %s, want bca", got)
	}
	b.q.ops = append(b.q.ops, q("d", span{4, 8}, span{100, 108})) // reads what a writes
	if b.sinkable(2) {
		t.Error("a sank past d, which reads what a writes")
	}
}

// TestFusionPassAllocates: the pass asks every queued op for its effects
// while ops are queued (a decode step queues hundreds); it allocates nothing.
func TestFusionPassAllocates(t *testing.T) {
	b := &Backend{}
	for i := range fuseWindow {
		p := uint64(1000 * (i + 1))
		b.q.ops = append(b.q.ops, op{gemv: &gemvOp{x: span{p, p + 64}, groups: []gemvGroup{{y: span{p + 100, p + 164}}}}})
	}
	var fx effects
	fx.read(span{0, 8})
	fx.write(span{16, 24})
	if n := testing.AllocsPerRun(100, func() { b.movable(0, &fx); b.sinkable(0) }); n != 0 {
		t.Errorf("the pass allocates %v times a check", n)
	}
}
