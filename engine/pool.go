package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/manifoldlm/manifold/model"
)

// ErrQueueFull is wrapped by the error of Pool.Acquire when more requests
// wait for a session than PoolOptions.MaxQueue allows.
var ErrQueueFull = errors.New("queue full")

// ErrPoolClosed is wrapped by the error of Pool.Acquire after Pool.Close.
var ErrPoolClosed = errors.New("pool closed")

// PoolOptions size a Pool. The zero value is the default of each.
type PoolOptions struct {
	// Sessions is the most sessions generating at once (0: 16). Where the
	// backend reports its memory (the CPU), it is lowered so that every
	// session's cache fits in half of it.
	Sessions int
	// ContextLength is the positions of each session (0: the model's
	// ContextLength).
	ContextLength int
	// MaxQueue is the most requests waiting for a session (0: 4 *
	// Sessions; negative: none wait, Acquire fails at once when every
	// session is taken).
	MaxQueue int
	// BlockSize is the positions of a block of the paged KV cache that the
	// sessions share where the model and the backend can page it
	// (model.Pager; the CPU and the CUDA backend can) (0: 16).
	BlockSize int
	// Blocks is the blocks of that cache (0: as many as Sessions caches of
	// ContextLength positions take, the memory of unpaged sessions).
	Blocks int
	// Unpaged gives each session a KVCache of its own even where the
	// cache could be paged.
	Unpaged bool
}

// Pool admits requests to a fixed set of sessions of a model, so that the
// cache memory is bounded: Acquire waits, first come first served, for a
// free session, and fails with ErrQueueFull past MaxQueue waiting. The
// sessions keep their tokens between requests: Acquire hands out the idle
// session whose tokens share the longest prefix with the request's prompt
// (a system prompt, a chat's earlier turns), so that prefix is not run
// again (prefix reuse). A Pool is safe for concurrent use.
//
// Where the cache can be paged (PoolOptions.BlockSize), the sessions keep a
// block table each into one pool of blocks instead: a released session
// gives its blocks back, its full ones staying cached by their prefix, and
// a request's prompt takes the cached blocks of its longest prefix of whole
// blocks, whichever sessions ran them, copy-on-write. A request is admitted
// when the free blocks hold the rest of its prompt, and waits for a release
// otherwise; a generation step waits while the blocks it needs are taken
// (BatchOptions), and fails with model.ErrNoBlocks when no other runs.
type Pool struct {
	m     *Model
	opts  PoolOptions
	paged *model.PagedCache // nil: a KVCache a session

	mu      sync.Mutex
	idle    []*Session // free, most recently released last
	made    int        // sessions made
	bytes   int64      // cache memory of one session
	waiters []chan *Session
	closed  bool
	reused  int64
	freed   chan struct{} // closed by the next Release (paged: blocks given back)
}

// PoolStats are a Pool's counts now.
type PoolStats struct {
	Sessions     int   // the most sessions (PoolOptions.Sessions, as fitted)
	Busy         int   // sessions acquired
	Waiting      int   // requests waiting for one
	CacheBytes   int64 // cache memory of the sessions made
	ReusedTokens int64 // prompt tokens not run again thanks to prefix reuse, since NewPool
	// The paged cache (all zero when the sessions keep a cache each).
	Paged                            bool
	BlockSize, Blocks                int
	FreeBlocks, CachedBlocks, Copies int // Copies: blocks copied on write since NewPool
}

// NewPool returns a pool of sessions of m.
func (m *Model) NewPool(o PoolOptions) (*Pool, error) {
	if o.Sessions < 0 || o.ContextLength < 0 {
		return nil, fmt.Errorf("engine: PoolOptions.Sessions %d, ContextLength %d: want >= 0 (0: the default)", o.Sessions, o.ContextLength)
	}
	if o.Sessions == 0 {
		o.Sessions = 16
	}
	if o.ContextLength == 0 {
		o.ContextLength = m.ctxLen
	}
	if mem := m.caps.Memory; mem != nil && mem.MemoryBytes() > 0 {
		need, _, err := m.stateBytes(o.ContextLength)
		if err != nil {
			return nil, fmt.Errorf("engine: pool: %w", err)
		}
		if fit := mem.MemoryBytes() / 2 / max(1, need); fit < int64(o.Sessions) {
			if fit < 1 {
				return nil, fmt.Errorf("engine: pool: one session of %d positions (PoolOptions.ContextLength) needs %d bytes of cache, more than half of %s's memory",
					o.ContextLength, need, m.Device())
			}
			o.Sessions = int(fit)
		}
	}
	if o.MaxQueue == 0 {
		o.MaxQueue = 4 * o.Sessions
	}
	p := &Pool{m: m, opts: o}
	if err := p.page(); err != nil {
		return nil, err
	}
	return p, nil
}

// Options are the pool's options, with the defaults and the memory's limit
// applied.
func (p *Pool) Options() PoolOptions { return p.opts }

// Acquire returns a free session for a request whose prompt is prompt (nil
// when not known), waiting while every session is taken, and the number of
// the prompt's first tokens that the session already holds: the caller
// generates from prompt[n:] (n < len(prompt) when the prompt is not empty,
// so that the last token runs and gives its logits). Every successful
// Acquire is paired with Release. ctx's cancellation ends the wait.
func (p *Pool) Acquire(ctx context.Context, prompt []int) (*Session, int, error) {
	for {
		s, n, err := p.acquire(ctx, prompt)
		if err != nil || p.paged == nil {
			return s, n, err
		}
		need, err := p.admit(s, prompt, n)
		if err == nil && need == 0 {
			return s, n, nil
		}
		p.Release(s)
		if err != nil {
			return nil, 0, err
		}
		select {
		case <-p.freedWhile(need):
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}

// acquire is Acquire before the paged cache's admission.
func (p *Pool) acquire(ctx context.Context, prompt []int) (*Session, int, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, 0, fmt.Errorf("engine: pool: %w", ErrPoolClosed)
	}
	var s *Session
	best, shared := p.bestIdle(prompt)
	switch {
	case best >= 0 && (shared > 0 || p.made == p.opts.Sessions || p.paged != nil):
		s = p.idle[best]
		p.idle = append(p.idle[:best], p.idle[best+1:]...)
	case p.made < p.opts.Sessions: // a new session keeps the idle ones' prefixes
		p.made++
		p.mu.Unlock()
		var err error
		if s, err = p.newSession(); err != nil {
			p.mu.Lock()
			p.made--
			p.mu.Unlock()
			return nil, 0, err
		}
		p.mu.Lock()
		p.bytes = s.CacheBytes()
	case len(p.waiters) >= max(0, p.opts.MaxQueue):
		p.mu.Unlock()
		return nil, 0, fmt.Errorf("engine: pool: %d requests wait for one of %d sessions: %w", len(p.waiters), p.opts.Sessions, ErrQueueFull)
	default:
		ch := make(chan *Session, 1)
		p.waiters = append(p.waiters, ch)
		p.mu.Unlock()
		select {
		case s = <-ch:
		case <-ctx.Done():
			p.mu.Lock()
			if i := indexOf(p.waiters, ch); i >= 0 {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				p.mu.Unlock()
				return nil, 0, ctx.Err()
			}
			p.mu.Unlock()
			p.Release(<-ch) // handed over as ctx ended: pass it on
			return nil, 0, ctx.Err()
		}
		if s == nil {
			return nil, 0, fmt.Errorf("engine: pool: %w", ErrPoolClosed)
		}
		p.mu.Lock()
	}
	n := p.keep(s, prompt)
	p.reused += int64(n)
	p.mu.Unlock()
	return s, n, nil
}

// bestIdle returns the index of the idle session sharing the longest prefix
// with prompt (the least recently used of those sharing none; -1: none is
// idle) and the length of that prefix. p.mu is held.
func (p *Pool) bestIdle(prompt []int) (best, shared int) {
	best, shared = -1, -1
	for i, s := range p.idle {
		if n := commonPrefix(s.tokens, prompt); n > shared {
			best, shared = i, n
		}
	}
	return best, shared
}

// keep truncates s to the part of prompt it holds (leaving at least one
// token of a non-empty prompt to run) and returns its length. Paged, s
// (empty) takes the cached blocks of prompt's prefix instead.
func (p *Pool) keep(s *Session, prompt []int) int {
	if p.paged != nil {
		return p.share(s, prompt)
	}
	n := commonPrefix(s.tokens, prompt)
	if n == len(prompt) && n > 0 {
		n--
	}
	s.Truncate(n)
	return n
}

func commonPrefix(a, b []int) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func indexOf(chs []chan *Session, ch chan *Session) int {
	for i, c := range chs {
		if c == ch {
			return i
		}
	}
	return -1
}

// Release returns a session that Acquire gave, keeping its tokens for a
// later request's prefix.
func (p *Pool) Release(s *Session) {
	if s == nil {
		return
	}
	if p.paged != nil {
		s.Truncate(0) // its full blocks stay cached by their prefix
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.freed != nil {
		close(p.freed)
		p.freed = nil
	}
	if len(p.waiters) > 0 {
		ch := p.waiters[0]
		p.waiters = p.waiters[1:]
		ch <- s
		return
	}
	p.idle = append(p.idle, s)
}

// Close fails the requests waiting and later Acquires with ErrPoolClosed;
// sessions acquired stay valid until released.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, ch := range p.waiters {
		ch <- nil
	}
	p.waiters = nil
}

// Stats returns the pool's counts.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := PoolStats{Sessions: p.opts.Sessions, Busy: p.made - len(p.idle), Waiting: len(p.waiters),
		CacheBytes: p.bytes * int64(p.made), ReusedTokens: p.reused}
	if p.paged != nil {
		ps := p.paged.Stats()
		st.CacheBytes, st.Paged, st.BlockSize, st.Blocks = p.paged.Bytes(), true, ps.BlockSize, ps.Blocks
		st.FreeBlocks, st.CachedBlocks, st.Copies = ps.Free, ps.Cached, int(ps.Copies)
	}
	return st
}

// EncodeChat renders a conversation through the model's chat template, with
// the prompt of an assistant turn, and returns its token ids (what Chat
// runs).
func (m *Model) EncodeChat(msgs []Message) ([]int, error) { return m.encodeChat(msgs) }
