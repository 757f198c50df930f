package engine

import (
	"errors"
	"fmt"

	"github.com/manifoldlm/manifold/model"
)

// page makes the pool's paged cache where the model and the backend can
// page one and the options allow it; a backend without the op group
// (backend.PagedAttentionOps, which the CPU and CUDA backends have) keeps a
// cache a session.
func (p *Pool) page() error {
	o := &p.opts
	if o.BlockSize < 0 || o.Blocks < 0 {
		return fmt.Errorf("engine: PoolOptions.BlockSize %d, Blocks %d: want >= 0 (0: the default)", o.BlockSize, o.Blocks)
	}
	pg, ok := p.m.net.(model.Pager)
	if !ok || o.Unpaged {
		return nil
	}
	if o.BlockSize == 0 {
		o.BlockSize = 16
	}
	if o.Blocks == 0 {
		o.Blocks = o.Sessions * ((o.ContextLength + o.BlockSize - 1) / o.BlockSize)
	}
	if mem := p.m.caps.Memory; mem != nil && mem.MemoryBytes() > 0 {
		per, err := p.m.cacheBytesPerToken()
		if err != nil {
			return fmt.Errorf("engine: pool: %w", err)
		}
		if bytes := per * int64(o.Blocks) * int64(o.BlockSize); bytes > mem.MemoryBytes()/2 {
			return fmt.Errorf("engine: pool: PoolOptions.Blocks %d of %d positions need %d bytes of cache, more than half of %s's memory",
				o.Blocks, o.BlockSize, bytes, p.m.Device())
		}
	}
	pc, err := pg.NewPagedCache(o.Blocks, o.BlockSize)
	switch {
	case errors.Is(err, model.ErrNoPaging):
		o.BlockSize, o.Blocks = 0, 0
		return nil
	case err != nil:
		return fmt.Errorf("engine: pool: %w", err)
	}
	p.paged = pc
	return nil
}

// newSession makes a session of the pool: on its paged cache when it has
// one.
func (p *Pool) newSession() (*Session, error) {
	if p.paged == nil {
		return p.m.NewSession(p.opts.ContextLength)
	}
	if err := p.m.acquire(); err != nil {
		return nil, err
	}
	defer p.m.done()
	st, err := p.paged.NewState(p.opts.ContextLength)
	if err != nil {
		return nil, fmt.Errorf("engine: new session: %w", err)
	}
	return &Session{m: p.m, st: st}, nil
}

// share makes s, empty, hold the cached blocks of prompt's longest prefix
// of whole blocks and returns its length. p.mu is held.
func (p *Pool) share(s *Session, prompt []int) int {
	s.Truncate(0)
	ids := make([]int32, len(prompt))
	for i, t := range prompt {
		if t < 0 || t >= p.m.cfg.VocabSize {
			return 0 // the request fails on it as unpaged
		}
		ids[i] = int32(t)
	}
	n := p.paged.Share(s.st, ids)
	s.tokens = append(s.tokens[:0], prompt[:n]...)
	return n
}

// admit reports whether the free blocks hold the rest of prompt (n of its
// tokens held by s): 0 if so, else the blocks it needs, or an error when no
// other session holds blocks (none will be given back).
func (p *Pool) admit(s *Session, prompt []int, n int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	need, free := p.paged.Need(s.st, len(prompt)-n), p.paged.FreeBlocks()
	if need <= free {
		return 0, nil
	}
	p.reused -= int64(n)
	if p.made-len(p.idle) <= 1 {
		return 0, fmt.Errorf("engine: pool: a prompt of %d tokens needs %d more blocks of %d positions, %d of %d are free: %w",
			len(prompt), need, p.opts.BlockSize, free, p.opts.Blocks, model.ErrNoBlocks)
	}
	return need, nil
}

// freedWhile returns a channel closed at the next Release, or at once when
// need blocks are free already.
func (p *Pool) freedWhile(need int) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if need <= p.paged.FreeBlocks() {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	if p.freed == nil {
		p.freed = make(chan struct{})
	}
	return p.freed
}
