package model

import (
	"context"
	"fmt"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/layers"
)

// llamaBatch is the scratch of ForwardBatch, shared by the sequences of a
// step: rows for every token of the step, and the last row of each sequence.
type llamaBatch struct {
	llamaBuffers
	seqs         int
	last, logits backend.Buffer // [seqs, hidden], [seqs, vocab]
}

// ForwardBatch runs one step over several sequences (BatchForwarder): the
// embedding, norms, matmuls and the LM head over the stacked rows of all of
// them, RoPE and attention over each sequence's rows, at its own positions
// and in its own cache.
func (m *Llama) ForwardBatch(ctx context.Context, sts []State, tokens [][]int32) ([]float32, error) {
	m.batchMu.Lock() // the logits buffer is the next batch's too
	defer m.batchMu.Unlock()
	logits, err := m.forwardBatch(ctx, sts, tokens)
	return hostLogits(m.b, logits, err)
}

// ForwardBatchDevice is ForwardBatch leaving the logits on the backend
// (BatchDeviceForwarder).
func (m *Llama) ForwardBatchDevice(ctx context.Context, sts []State, tokens [][]int32) (backend.Buffer, error) {
	m.batchMu.Lock()
	defer m.batchMu.Unlock()
	return m.forwardBatch(ctx, sts, tokens)
}

// forwardBatch runs the step (m.batchMu held) and returns the logits on
// the backend.
func (m *Llama) forwardBatch(ctx context.Context, sts []State, tokens [][]int32) (backend.Buffer, error) {
	if len(sts) == 0 || len(sts) != len(tokens) {
		return nil, fmt.Errorf("model: forward batch of %d states and %d token lists", len(sts), len(tokens))
	}
	c, b := m.cfg, m.b
	ss := make([]*llamaState, len(sts))
	pos0 := make([]int, len(sts))
	last := make([]int32, len(sts))
	var ids []int32
	seen := make(map[*llamaState]bool, len(sts))
	for i, st := range sts {
		s, ok := st.(*llamaState)
		if !ok {
			return nil, fmt.Errorf("model: state %d of type %T is not a %s state", i, st, c.ModelType)
		}
		if seen[s] {
			return nil, fmt.Errorf("model: forward batch: state %d appears twice", i)
		}
		seen[s] = true
		if err := checkForward(c, st, tokens[i]); err != nil {
			return nil, fmt.Errorf("model: forward batch: sequence %d: %w", i, err)
		}
		ss[i], pos0[i] = s, s.cache.Len()
		ids = append(ids, tokens[i]...)
		last[i] = int32(len(ids) - 1)
	}
	n, seqs := len(ids), len(sts)
	shared, err := reservePaged(ss, tokens)
	if err != nil {
		return nil, err
	}

	bt := &m.batch
	m.grow(&bt.llamaBuffers, n)
	if bt.seqs < seqs {
		bt.seqs = seqs
		bt.last = b.NewBuffer(seqs * c.HiddenSize)
		bt.logits = b.NewBuffer(seqs * c.VocabSize)
	}
	sc := m.views(&bt.llamaBuffers, n)
	b.Embed(sc.x, m.Embed, ids)
	qw, kw := c.NumHeads*c.HeadDim, c.NumKVHeads*c.HeadDim
	var paged []layers.PagedSeq // every layer's sequences, when shared
	if shared != nil {
		paged = pagedSeqs(ss, pos0, tokens)
	}
	err = m.blocks(ctx, sc, n, func(l int, att, q, k, v backend.Buffer) {
		if shared != nil { // one call over every sequence's blocks
			m.attendPaged(shared, l, att, q, k, v, paged)
			return
		}
		row := 0
		for i, s := range ss {
			r := len(tokens[i])
			rows := func(buf backend.Buffer, width int) backend.Buffer { return b.View(buf, row*width, r*width) }
			m.attend(s, l, rows(att, qw), rows(q, qw), rows(k, kw), rows(v, kw), pos0[i], r)
			row += r
		}
	})
	if err != nil {
		for i, s := range ss {
			s.cache.Truncate(pos0[i])
		}
		return nil, err
	}
	for _, s := range ss {
		if p := pagedOf(s); p != nil {
			p.seq.Commit()
		}
	}
	x := sc.x
	if n != seqs { // some sequence ran several rows: take each one's last
		x = b.View(bt.last, 0, seqs*c.HiddenSize)
		b.GatherRows(x, sc.x, last, c.HiddenSize)
	}
	return m.head.logits(b, c, x, b.View(sc.h, 0, seqs*c.HiddenSize), bt.logits, seqs, true), nil
}

// reservePaged makes room for each paged state's tokens (undoing them all
// on error) and returns the paged cache every state shares, or nil when
// some state is not paged or they are paged in several caches.
func reservePaged(ss []*llamaState, tokens [][]int32) (*PagedCache, error) {
	var shared *PagedCache
	for i, s := range ss {
		p := pagedOf(s)
		if p == nil {
			continue
		}
		pos0 := p.Len()
		if err := p.reserve(tokens[i]); err != nil {
			for j := range i {
				ss[j].cache.Truncate(ss[j].cache.Len() - len(tokens[j]))
			}
			return nil, fmt.Errorf("model: forward batch: sequence %d at %d: %w", i, pos0, err)
		}
		if i == 0 || shared == p.c {
			shared = p.c
		} else {
			shared = nil
		}
	}
	for _, s := range ss {
		if p := pagedOf(s); p == nil || p.c != shared {
			return nil, nil
		}
	}
	return shared, nil
}

// pagedSeqs describes the rows of a step over paged states (reserved):
// each one's block table, first position and rows, the same for every
// layer, so that each layer's calls name the same sequences (the backend
// then reuses its description of them: kernels' pagedEncode).
func pagedSeqs(ss []*llamaState, pos0 []int, tokens [][]int32) []layers.PagedSeq {
	seqs := make([]layers.PagedSeq, len(ss))
	for i, s := range ss {
		seqs[i] = layers.PagedSeq{Table: pagedOf(s).seq.Table(), Pos0: pos0[i], Rows: len(tokens[i])}
	}
	return seqs
}
