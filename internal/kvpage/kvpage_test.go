package kvpage

import (
	"errors"
	"testing"
)

// sim stores one int32 a position (the token) where the tables say, as a
// backend stores key and value rows.
type sim struct {
	a    *Allocator
	rows []int32
}

// run appends tokens to s, making the copies asked and checking that no
// row is written into a block another sequence or the cache holds.
func (p *sim) run(t *testing.T, s *Seq, tokens []int32) error {
	t.Helper()
	bs := p.a.blockSize
	copies, err := s.Append(tokens)
	if err != nil {
		return err
	}
	for _, c := range copies {
		copy(p.rows[int(c[0])*bs:(int(c[0])+1)*bs], p.rows[int(c[1])*bs:(int(c[1])+1)*bs])
	}
	for i, tok := range tokens {
		pos := s.Len() - len(tokens) + i
		id := s.Table()[pos/bs]
		if p.a.ref[id] != 1 || p.a.tokens[id] != nil {
			t.Fatalf("position %d written into block %d held %d times, cached %v", pos, id, p.a.ref[id], p.a.tokens[id] != nil)
		}
		p.rows[int(id)*bs+pos%bs] = tok
	}
	s.Commit()
	return nil
}

// check reads s's positions back through its table.
func (p *sim) check(t *testing.T, name string, s *Seq, want []int32) {
	t.Helper()
	if s.Len() != len(want) {
		t.Fatalf("%s: %d positions, want %d", name, s.Len(), len(want))
	}
	for pos, w := range want {
		if got := p.rows[int(s.Table()[pos/p.a.blockSize])*p.a.blockSize+pos%p.a.blockSize]; got != w {
			t.Fatalf("%s: position %d holds %d, want %d", name, pos, got, w)
		}
	}
}

func seqOf(prefix, n int, tag int32) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(i)
		if i >= prefix {
			v[i] = tag*1000 + int32(i)
		}
	}
	return v
}

// TestShare runs a first sequence, then a second whose prompt shares a
// prefix with it: the second holds the first's full blocks of the shared
// prefix (copying a block it writes into), and both read back their own
// tokens, before and after the first is released.
func TestShare(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		bs, blocks             int
		first, common, second  int // lengths: first prompt, shared prefix, second prompt
		firstGen, secondGen    int // tokens generated after each prompt
		wantShared, wantCopies int
	}{
		{"no common prefix", 4, 16, 10, 0, 9, 2, 2, 0, 0},
		{"prefix of whole blocks", 4, 16, 12, 8, 11, 1, 3, 8, 0},
		{"prefix off a block", 4, 16, 13, 10, 14, 0, 2, 8, 0},
		{"same prompt of whole blocks", 4, 16, 12, 12, 12, 3, 2, 11, 1},
		{"same prompt off a block", 5, 16, 13, 13, 13, 2, 2, 10, 0},
		{"blocks of one", 1, 40, 7, 7, 7, 1, 1, 6, 1},
		{"second is a prefix of the first", 3, 16, 14, 7, 7, 0, 4, 6, 0},
		{"one big block", 64, 4, 20, 20, 20, 5, 5, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := New(tc.blocks, tc.bs)
			if err != nil {
				t.Fatal(err)
			}
			p := &sim{a: a, rows: make([]int32, tc.blocks*tc.bs)}
			s1 := a.NewSeq()
			all1 := seqOf(tc.first, tc.first+tc.firstGen, 1)
			if err := p.run(t, s1, all1[:tc.first]); err != nil {
				t.Fatal(err)
			}
			for _, tok := range all1[tc.first:] {
				if err := p.run(t, s1, []int32{tok}); err != nil {
					t.Fatal(err)
				}
			}
			s2 := a.NewSeq()
			all2 := seqOf(tc.common, tc.second+tc.secondGen, 2)
			if got := s2.Share(all2[:tc.second]); got != tc.wantShared {
				t.Fatalf("Share = %d, want %d", got, tc.wantShared)
			}
			if err := p.run(t, s2, all2[s2.Len():tc.second]); err != nil {
				t.Fatal(err)
			}
			for _, tok := range all2[tc.second:] {
				if err := p.run(t, s2, []int32{tok}); err != nil {
					t.Fatal(err)
				}
			}
			p.check(t, "first", s1, all1)
			p.check(t, "second", s2, all2)
			if got := a.Stats().Copies; got != int64(tc.wantCopies) {
				t.Errorf("%d copies, want %d", got, tc.wantCopies)
			}
			s1.Release()
			p.check(t, "second after the first's release", s2, all2)
			s2.Release()
			if st := a.Stats(); st.Free != tc.blocks {
				t.Errorf("%d blocks free after both released, want %d", st.Free, tc.blocks)
			}
			// A third sequence with the second's prompt finds it cached.
			s3 := a.NewSeq()
			if got, want := s3.Share(all2[:tc.second]), min(tc.second-1, tc.second/tc.bs*tc.bs); got != want {
				t.Errorf("after release, Share = %d, want %d", got, want)
			}
		})
	}
}

// TestExhaustion fills the pool: Append fails with ErrNoBlocks and leaves
// the sequence as it was; cached blocks no sequence holds are reused.
func TestExhaustion(t *testing.T) {
	for _, tc := range []struct {
		bs, blocks, n int
	}{{4, 3, 13}, {1, 5, 6}, {8, 2, 17}} {
		a, _ := New(tc.blocks, tc.bs)
		p := &sim{a: a, rows: make([]int32, tc.blocks*tc.bs)}
		s := a.NewSeq()
		toks := seqOf(0, tc.n, 1)
		err := p.run(t, s, toks)
		if !errors.Is(err, ErrNoBlocks) || s.Len() != 0 || a.Free() != tc.blocks {
			t.Fatalf("%+v: Append past the pool: err %v, len %d, free %d", tc, err, s.Len(), a.Free())
		}
		if err := p.run(t, s, toks[:tc.blocks*tc.bs]); err != nil {
			t.Fatal(err)
		}
		s.Release()
		other := a.NewSeq()
		if err := p.run(t, other, seqOf(0, tc.blocks*tc.bs, 2)[1:]); err != nil {
			t.Fatalf("%+v: cached blocks not reused: %v", tc, err)
		}
		p.check(t, "other", other, seqOf(0, tc.blocks*tc.bs, 2)[1:])
	}
}

// TestTruncateRewrite truncates into a cached block and writes other
// tokens: the block is forgotten by the cache (or copied when shared), so
// that a later Share does not find the old prefix's rows.
func TestTruncateRewrite(t *testing.T) {
	for _, shared := range []bool{false, true} {
		a, _ := New(8, 4)
		p := &sim{a: a, rows: make([]int32, 32)}
		s := a.NewSeq()
		toks := seqOf(0, 8, 1)
		if err := p.run(t, s, toks); err != nil {
			t.Fatal(err)
		}
		var o *Seq
		if shared {
			o = a.NewSeq()
			if n := o.Share(append(toks[:8:8], 99)); n != 8 {
				t.Fatalf("Share = %d, want 8", n)
			}
		}
		s.Truncate(6)
		if err := p.run(t, s, []int32{-1, -2}); err != nil {
			t.Fatal(err)
		}
		p.check(t, "rewritten", s, append(toks[:6:6], -1, -2))
		if shared {
			p.check(t, "sharer", o, toks)
		}
		n := a.NewSeq().Share(append(toks[:8:8], 99))
		if want := map[bool]int{false: 4, true: 8}[shared]; n != want {
			t.Errorf("shared %v: Share after the rewrite = %d, want %d", shared, n, want)
		}
	}
}
