// Package kvpage allocates the blocks of a paged KV cache: fixed-size blocks
// shared by the sequences of a model through a block table each, with
// reference counts, prefix sharing and copy-on-write. It moves no data: the
// caller stores rows where the tables say (backend.PagedAttentionOps) and
// copies the blocks Append asks it to.
//
// Prefix sharing is vLLM's prefix caching: a full block is known by a hash
// of its tokens chained with the hash of the blocks before it, so that equal
// hashes mean equal prefixes (the tokens are compared too, so that a hash
// collision only costs a miss). Full blocks stay cached when no sequence
// holds them, and are reused, least recently released first, only when no
// free block is left.
package kvpage

import (
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
)

// ErrNoBlocks is wrapped by the error of Seq.Append when the pool has too
// few blocks left.
var ErrNoBlocks = errors.New("no free KV cache blocks")

// Allocator hands out the block ids 0..Blocks-1 of one pool. It is safe
// for concurrent use; a Seq is not.
type Allocator struct {
	mu        sync.Mutex
	blockSize int
	seed      maphash.Seed
	ref       []int32   // sequences holding each block
	tokens    [][]int32 // tokens of each registered (full, cached) block
	hash      []uint64  // chained hash of each registered block
	cached    map[uint64]int32
	free      []int32 // unregistered blocks no sequence holds
	// idle are registered blocks no sequence holds, least recently
	// released first: reused when free is empty.
	idle  []int32
	stats Stats
}

// Stats are an Allocator's counts.
type Stats struct {
	Blocks, BlockSize int
	Free              int   // blocks no sequence holds (cached ones included)
	Cached            int   // full blocks known by their prefix
	SharedTokens      int64 // positions taken from cached blocks by Share
	Copies            int64 // copy-on-write block copies
}

// New returns an allocator of blocks blocks of blockSize positions.
func New(blocks, blockSize int) (*Allocator, error) {
	if blocks <= 0 || blockSize <= 0 {
		return nil, fmt.Errorf("kvpage: %d blocks of %d positions: want both > 0", blocks, blockSize)
	}
	a := &Allocator{blockSize: blockSize, seed: maphash.MakeSeed(), ref: make([]int32, blocks),
		tokens: make([][]int32, blocks), hash: make([]uint64, blocks), cached: map[uint64]int32{}}
	for i := blocks - 1; i >= 0; i-- {
		a.free = append(a.free, int32(i))
	}
	return a, nil
}

// BlockSize is the positions of a block.
func (a *Allocator) BlockSize() int { return a.blockSize }

// Stats returns the counts now.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Blocks, s.BlockSize = len(a.ref), a.blockSize
	s.Free, s.Cached = len(a.free)+len(a.idle), len(a.cached)
	return s
}

// Free is the blocks a sequence could take now.
func (a *Allocator) Free() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.free) + len(a.idle)
}

// chain is the hash of a block of tokens after blocks whose hash is prev.
func (a *Allocator) chain(prev uint64, tokens []int32) uint64 {
	var h maphash.Hash
	h.SetSeed(a.seed)
	var b [8]byte
	for i := range b {
		b[i] = byte(prev >> (8 * i))
	}
	h.Write(b[:])
	for _, t := range tokens {
		h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64()
}

// take returns a block for a sequence: a free one, else the least recently
// released cached one (forgetting its prefix). a.mu is held.
func (a *Allocator) take() (int32, bool) {
	var id int32
	switch {
	case len(a.free) > 0:
		id, a.free = a.free[len(a.free)-1], a.free[:len(a.free)-1]
	case len(a.idle) > 0:
		id, a.idle = a.idle[0], a.idle[1:]
		a.unregister(id)
	default:
		return 0, false
	}
	a.ref[id] = 1
	return id, true
}

func (a *Allocator) unregister(id int32) {
	if a.tokens[id] != nil {
		delete(a.cached, a.hash[id])
		a.tokens[id] = nil
	}
}

// hold adds a holder to a block. a.mu is held.
func (a *Allocator) hold(id int32) {
	if a.ref[id] == 0 {
		a.idle = slices.DeleteFunc(a.idle, func(x int32) bool { return x == id })
	}
	a.ref[id]++
}

// drop removes a holder from a block. a.mu is held.
func (a *Allocator) drop(id int32) {
	if a.ref[id]--; a.ref[id] > 0 {
		return
	}
	if a.tokens[id] != nil {
		a.idle = append(a.idle, id)
	} else {
		a.free = append(a.free, id)
	}
}

// Seq is one sequence's block table and tokens.
type Seq struct {
	a      *Allocator
	table  []int32
	tokens []int32  // tokens whose rows the blocks hold (or will, once run)
	hashes []uint64 // chained hash of each full block
	done   int      // tokens committed (their rows are stored)
}

// NewSeq returns an empty sequence.
func (a *Allocator) NewSeq() *Seq { return &Seq{a: a} }

// Table is the block table: position p lies in block Table()[p/BlockSize].
// It is valid until the next call that changes the sequence.
func (s *Seq) Table() []int32 { return s.table }

// Len is the positions the sequence holds.
func (s *Seq) Len() int { return len(s.tokens) }

// Blocks is the blocks n positions take.
func (a *Allocator) Blocks(n int) int { return (n + a.blockSize - 1) / a.blockSize }

// Share makes an empty sequence hold the cached blocks of the longest
// prefix of prompt made of whole blocks, leaving at least one token of a
// non-empty prompt unshared (it must run to give logits), and returns the
// positions it holds.
func (s *Seq) Share(prompt []int32) int {
	if len(s.tokens) != 0 {
		return 0
	}
	a, bs := s.a, s.a.blockSize
	a.mu.Lock()
	defer a.mu.Unlock()
	var prev uint64
	for (len(s.table)+1)*bs < len(prompt)+1 {
		blk := prompt[len(s.table)*bs : (len(s.table)+1)*bs]
		h := a.chain(prev, blk)
		id, ok := a.cached[h]
		if !ok || !slices.Equal(a.tokens[id], blk) {
			break
		}
		a.hold(id)
		s.table, s.hashes, prev = append(s.table, id), append(s.hashes, h), h
		s.tokens = append(s.tokens, blk...)
	}
	// The last prompt token must run: a prompt of whole cached blocks
	// gives back its last block's last position, copied on write.
	if len(s.tokens) == len(prompt) && len(prompt) > 0 {
		s.tokens = s.tokens[:len(prompt)-1]
		s.hashes = s.hashes[:len(s.tokens)/bs]
	}
	s.done = len(s.tokens)
	a.stats.SharedTokens += int64(len(s.tokens))
	return len(s.tokens)
}

// Need is the blocks Append of n tokens would take: new ones, and a copy
// of the block position Len() falls in when other sequences hold it.
func (s *Seq) Need(n int) int {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	need, _ := s.need(n)
	return need
}

// written is the block position Len() falls in when the table holds it
// already (-1: none). a.mu is held.
func (s *Seq) written() int32 {
	if i := len(s.tokens) / s.a.blockSize; i < len(s.table) {
		return s.table[i]
	}
	return -1
}

// need is Need, and whether that block must be copied. a.mu is held.
func (s *Seq) need(n int) (need int, copied bool) {
	a := s.a
	need = a.Blocks(len(s.tokens)+n) - len(s.table)
	if id := s.written(); n > 0 && id >= 0 && a.ref[id] > 1 {
		need, copied = need+1, true
	}
	return need, copied
}

// Append makes room for tokens at positions Len().. and returns the block
// copies ({dst, src}) the caller must make before it stores their rows: a
// block the new rows fall in that other sequences hold is copied first
// (copy-on-write); one only this sequence holds is forgotten by the cache
// if it knew it. With too few blocks left it fails with ErrNoBlocks and
// leaves the sequence as it was.
func (s *Seq) Append(tokens []int32) (copies [][2]int32, err error) {
	a := s.a
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(s.tokens)
	need, copied := s.need(len(tokens))
	if need > len(a.free)+len(a.idle) {
		return nil, fmt.Errorf("kvpage: %d positions need %d more blocks, %d left: %w", n+len(tokens), need, len(a.free)+len(a.idle), ErrNoBlocks)
	}
	if src := s.written(); len(tokens) > 0 && src >= 0 {
		if copied {
			dst, _ := a.take()
			a.drop(src)
			s.table[n/a.blockSize] = dst
			copies = append(copies, [2]int32{dst, src})
			a.stats.Copies++
		} else {
			a.unregister(src)
		}
	}
	for len(s.table) < a.Blocks(n+len(tokens)) {
		id, _ := a.take()
		s.table = append(s.table, id)
	}
	s.tokens = append(s.tokens, tokens...)
	return copies, nil
}

// Commit records that the rows of every position have been stored: each
// block they filled becomes known by its prefix, for Share, unless it holds
// a negative token (one whose id the caller does not know).
func (s *Seq) Commit() {
	a, bs := s.a, s.a.blockSize
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(s.hashes) < len(s.tokens)/bs {
		i := len(s.hashes)
		var prev uint64
		if i > 0 {
			prev = s.hashes[i-1]
		}
		blk := s.tokens[i*bs : (i+1)*bs]
		h := a.chain(prev, blk)
		s.hashes = append(s.hashes, h)
		id := s.table[i]
		if _, ok := a.cached[h]; !ok && a.tokens[id] == nil && !slices.ContainsFunc(blk, func(t int32) bool { return t < 0 }) {
			a.cached[h], a.hash[id], a.tokens[id] = id, h, slices.Clone(blk)
		}
	}
	s.done = len(s.tokens)
}

// Truncate forgets every position from n on, giving back the blocks past
// the last one it still needs.
func (s *Seq) Truncate(n int) {
	a, bs := s.a, s.a.blockSize
	n = max(0, min(n, len(s.tokens)))
	a.mu.Lock()
	defer a.mu.Unlock()
	keep := a.Blocks(n)
	for _, id := range s.table[keep:] {
		a.drop(id)
	}
	s.table = s.table[:keep]
	s.tokens = s.tokens[:n]
	s.hashes = s.hashes[:min(len(s.hashes), n/bs)]
	s.done = min(s.done, n)
}

// Release gives back every block (Truncate(0)); full ones stay cached.
func (s *Seq) Release() { s.Truncate(0) }
