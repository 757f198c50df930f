package kernels

import (
	"fmt"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// BenchmarkPagedDescribe is the host's work of describing a decode step's
// sequences to the paged kernels (pagedEncode, then pagedSlot finding the
// description placed already), as every paged call of a layer does it:
// c sequences at the Llama-3-8B shape's 768 positions (48 blocks of 16),
// no device needed. A step of 32 layers makes 64 such calls.
func BenchmarkPagedDescribe(b *testing.B) {
	for _, c := range []int{1, 8, 32, 64, 128} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			const bs, tab = 16, 48
			p := &pagedPool{shape: backend.PagedShape{Layers: 32, KVHeads: 8, HeadDim: 128, BlockSize: bs, Blocks: c * tab}}
			g := &Backend{dyn: &allocation{}}
			seqs := make([]layers.PagedSeq, c)
			for i := range seqs {
				t := make([]int32, tab)
				for j := range t {
					t[j] = int32(i*tab + j)
				}
				seqs[i] = layers.PagedSeq{Table: t, Pos0: 700 + i%40, Rows: 1}
			}
			for b.Loop() {
				g.q.dyn, g.paged.at = g.q.dyn[:0], 0
				for range 64 {
					if _, err := g.pagedEncode(p, seqs); err != nil {
						b.Fatal(err)
					}
					if _, _, err := g.pagedSlot(); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/step")
		})
	}
}

// TestPagedEncodeReuse: a description pagedEncode reuses (the same rows
// described again) is the one a fresh encoding gives, and any change of
// the sequences (a table changed in place, as copy-on-write does, a
// position, the rows, a table's length, the pool) is encoded again; a
// bad table is refused whatever was encoded before. No device needed.
func TestPagedEncodeReuse(t *testing.T) {
	shape := backend.PagedShape{Layers: 2, KVHeads: 1, HeadDim: 8, BlockSize: 4, Blocks: 64}
	p, p2 := &pagedPool{shape: shape}, &pagedPool{shape: shape}
	g := &Backend{dyn: &allocation{}}
	seqs := []layers.PagedSeq{{Table: []int32{3, 7}, Pos0: 5, Rows: 1}, {Table: []int32{9, 1, 2}, Pos0: 8, Rows: 2}}
	check := func(what string, pool *pagedPool) {
		t.Helper()
		rows, err := g.pagedEncode(pool, seqs)
		fresh := &Backend{}
		want, werr := fresh.pagedEncode(pool, seqs)
		if err != nil || werr != nil || rows != want || !equalInt32(g.paged.enc, fresh.paged.enc) {
			t.Errorf("%s: rows %d %v, enc %v; fresh %d %v, %v", what, rows, err, g.paged.enc, want, werr, fresh.paged.enc)
		}
	}
	check("first", p)
	g.paged.enc = append(g.paged.enc, 42, 43) // a PagedAttention's lists
	check("again", p)
	seqs[1].Table[2] = 4
	check("a table changed in place", p)
	seqs[0].Pos0++
	check("a position", p)
	seqs[1].Rows = 1
	check("rows", p)
	seqs[0].Table = append(seqs[0].Table, 11)
	check("a longer table", p)
	check("another pool", p2)
	seqs[0].Table[0] = 64
	if _, err := g.pagedEncode(p2, seqs); err == nil {
		t.Error("a block outside the pool: no error")
	}
}

// TestPagedSplits: paged_attn's splits cover the launch's positions
// (rounded up to pagedRound) with none past them, at a multiple of
// pagedMinKeys keys each and at most pagedMaxSplits, and give the shapes
// pagedSplits' comment names (the 8B shape's 8 kv heads at 548 positions
// on 132 multiprocessors). No device needed.
func TestPagedSplits(t *testing.T) {
	g := &Backend{sms: 132}
	for _, c := range []struct{ blocks, longest, splits, keys int }{{8, 549, 36, 16}, {64, 549, 9, 64}, {256, 549, 3, 192}, {1024, 549, 1, 576}} {
		if s, k := g.pagedSplits(c.blocks, c.longest); s != c.splits || k != c.keys {
			t.Errorf("%d blocks over %d positions: %d splits of %d keys, want %d of %d", c.blocks, c.longest, s, k, c.splits, c.keys)
		}
	}
	for _, sms := range []int{0, 1, 78, 132} {
		g.sms = sms
		for blocks := 1; blocks <= 2048; blocks = blocks*3/2 + 1 {
			for longest := 1; longest <= 40000; longest = longest*5/4 + 1 {
				s, k := g.pagedSplits(blocks, longest)
				span := (longest + pagedRound - 1) / pagedRound * pagedRound
				if s < 1 || s > pagedMaxSplits || k%pagedMinKeys != 0 || s*k < span || (s-1)*k >= span {
					t.Fatalf("%d SMs, %d blocks over %d positions: %d splits of %d keys", sms, blocks, longest, s, k)
				}
			}
		}
	}
}
