package kernels

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/manifoldlm/manifold/backend"
)

var _ backend.TokenSampler = (*Backend)(nil)

// sampleBlocks is the number of vocabulary slices of the first sampling stage.
const sampleBlocks = 64

// Shared memory of the two stages: a value, an id and a flag per entry.
const (
	sampleFinalShared   = 9 * sampleBlocks * backend.MaxSampleTopK
	samplePartialShared = 44 << 10 // under the default 48 KB with the static arrays
)

// sampler is the device scratch of SampleToken, made on first use; mu
// serializes its users. SampleTokenTo's ids come back through a ring of
// pinned host words, each with an event that marks its arrival.
type sampler struct {
	cand   *allocation // sampleBlocks*MaxSampleTopK floats, then as many ints
	out    *allocation // one int
	host   unsafe.Pointer
	events [sampleSlots]uintptr
	picks  uint64 // SampleTokenTo calls so far: the next one uses slot picks % sampleSlots

	// SampleTokens' candidates (rowsLen floats, then as many ints) and ids.
	rows, ids       *allocation
	rowsLen, idsLen int
}

// cuEventDisableTiming is CU_EVENT_DISABLE_TIMING: the lightest event.
const cuEventDisableTiming = 2

// sampleSlots bounds the picks on their way to the host at once.
const sampleSlots = 16

var (
	_ backend.TokenPipeliner = (*Backend)(nil)
	_ backend.PendingToken   = (*pendingToken)(nil)
)

// SampleToken picks the next token on the device (see backend.TokenSampler);
// four bytes come back.
func (b *Backend) SampleToken(logits backend.Buffer, temperature float32, topK int, u float64) (int, error) {
	b.sampleMu.Lock()
	defer b.sampleMu.Unlock()
	if err := b.queueSample(0, logits, temperature, topK, u); err != nil {
		return 0, err
	}
	var id int32
	b.onContext(func() {
		b.setErr(b.d.check("cuMemcpyDtoH", b.d.cuMemcpyDtoH(unsafe.Pointer(&id), b.sample.out.ptr, 4)))
	})
	runtime.KeepAlive(logits)
	if err := b.Sync(); err != nil {
		return 0, err
	}
	return pickedID(id)
}

// pickedID is the id a sampling kernel wrote: -1 - i when logit i is NaN.
func pickedID(id int32) (int, error) {
	if id < 0 {
		return 0, fmt.Errorf("kernels: logit %d is NaN; no token drawn", -1-int(id))
	}
	return int(id), nil
}

// SampleTokenTo is SampleToken leaving the id in dst and coming back without
// waiting (see backend.TokenPipeliner).
func (b *Backend) SampleTokenTo(dst, logits backend.Buffer, temperature float32, topK int, u float64) (backend.PendingToken, error) {
	if dst.Len() != 1 {
		return nil, fmt.Errorf("kernels: a sampled token goes to a buffer of 1 element, not %d", dst.Len())
	}
	b.sampleMu.Lock()
	defer b.sampleMu.Unlock()
	if b.sample.host == nil {
		var err error
		b.onContext(func() {
			err = b.d.check("cuMemAllocHost", b.d.cuMemAllocHost(&b.sample.host, 4*sampleSlots))
			for i := range b.sample.events {
				if err == nil {
					err = b.d.check("cuEventCreate", b.d.cuEventCreate(&b.sample.events[i], cuEventDisableTiming))
				}
			}
		})
		if err != nil {
			return nil, err
		}
	}
	if err := b.queueSample(ptr(dst), logits, temperature, topK, u); err != nil {
		return nil, err
	}
	p := &pendingToken{b: b, seq: b.sample.picks}
	b.sample.picks++
	slot := int(p.seq % sampleSlots)
	b.onContext(func() { // launches the sampler, then the copy and its event
		b.setErr(b.d.check("cuMemcpyDtoHAsync", b.d.cuMemcpyDtoHAsync(unsafe.Add(b.sample.host, 4*slot), ptr(dst), 4, b.stream)))
		b.setErr(b.d.check("cuEventRecord", b.d.cuEventRecord(b.sample.events[slot], b.stream)))
	})
	runtime.KeepAlive(logits)
	runtime.KeepAlive(dst)
	return p, nil
}

// pendingToken is a SampleTokenTo pick on its way to pinned slot seq % sampleSlots.
type pendingToken struct {
	b   *Backend
	seq uint64
}

// Wait waits for the pick's event and reads its slot. The lock is not held
// while waiting, so other sessions' picks go on meanwhile.
func (p *pendingToken) Wait() (int, error) {
	b := p.b
	slot := int(p.seq % sampleSlots)
	overwritten := func() error {
		if n := b.sample.picks - p.seq; n > sampleSlots {
			return fmt.Errorf("kernels: sampled token %d was overwritten by %d later picks before it was read", p.seq, n-1)
		}
		return nil
	}
	b.sampleMu.Lock()
	err := overwritten()
	ev := b.sample.events[slot]
	b.sampleMu.Unlock()
	if err != nil {
		return 0, err
	}
	b.d.onContext(b.ctx, func() { // not b.onContext: what is queued after the pick may stay queued
		err = b.d.check("cuEventSynchronize", b.d.cuEventSynchronize(ev))
	})
	if err == nil {
		err = b.takeErr()
	}
	if err != nil {
		return 0, err
	}
	b.sampleMu.Lock()
	defer b.sampleMu.Unlock()
	if err := overwritten(); err != nil { // a later pick took the slot while this one waited
		return 0, err
	}
	return pickedID(*(*int32)(unsafe.Add(b.sample.host, 4*slot)))
}

// queueSample queues the two sampling kernels over logits, the pick going to
// out (0: the sampler's own word), after launching what is queued. sampleMu
// must be held.
func (b *Backend) queueSample(out uint64, logits backend.Buffer, temperature float32, topK int, u float64) error {
	n := logits.Len()
	if n == 0 {
		return fmt.Errorf("kernels: sampling from no logits")
	}
	k := 1
	if temperature > 0 {
		if topK <= 0 || topK > backend.MaxSampleTopK {
			return fmt.Errorf("kernels: top-k %d outside [1, %d]", topK, backend.MaxSampleTopK)
		}
		k = topK
	}
	// Launch what is queued (a decode step) before queueing the sampler, whose
	// draw u changes every step: the step then replays as one graph (queue.go).
	b.onContext(func() {})
	if b.sample.cand == nil {
		var err error
		if b.sample.cand, err = b.alloc(2 * 4 * sampleBlocks * backend.MaxSampleTopK); err != nil {
			return err
		}
		if b.sample.out, err = b.alloc(4); err != nil {
			return err
		}
	}
	if out == 0 {
		out = b.sample.out.ptr
	}
	candv := b.sample.cand.ptr
	candi := candv + 4*sampleBlocks*backend.MaxSampleTopK
	chunk := (n + sampleBlocks - 1) / sampleBlocks
	if 9*chunk > samplePartialShared {
		return fmt.Errorf("kernels: a vocabulary of %d is too large for the device sampler", n)
	}
	b.launch("sample_partial", [3]int{sampleBlocks, 1, 1}, 256, chunk*9, ptr(logits), n, chunk, k, candv, candi)
	m := sampleBlocks * k
	b.launch("sample_final", [3]int{1, 1, 1}, 256, m*9, candv, candi, m, k, temperature, u, out)
	return nil
}

var _ backend.BatchTokenSampler = (*Backend)(nil)

// SampleTokens picks the tokens of several rows of logits in two launches
// (sample_partial_rows, sample_final_rows: SampleToken's two stages, a row
// of blocks a pick), the picks' options in the queue's step values; the ids
// come back in one copy.
func (b *Backend) SampleTokens(ids []int, logits backend.Buffer, vocab int, picks []backend.SamplePick) error {
	if len(ids) != len(picks) {
		return fmt.Errorf("kernels: %d ids for %d picks", len(ids), len(picks))
	}
	if len(picks) == 0 {
		return nil
	}
	if vocab <= 0 || logits.Len()%vocab != 0 {
		return fmt.Errorf("kernels: sampling rows of %d from %d logits", vocab, logits.Len())
	}
	chunk := (vocab + sampleBlocks - 1) / sampleBlocks
	if 9*chunk > samplePartialShared {
		return fmt.Errorf("kernels: a vocabulary of %d is too large for the device sampler", vocab)
	}
	rows := logits.Len() / vocab
	args := make([]int32, 0, 5*len(picks))
	kmax := 1
	for i, p := range picks {
		k := 1
		if p.Temperature > 0 {
			if p.TopK <= 0 || p.TopK > backend.MaxSampleTopK {
				return fmt.Errorf("kernels: pick %d: top-k %d outside [1, %d]", i, p.TopK, backend.MaxSampleTopK)
			}
			k = p.TopK
		}
		if p.Row < 0 || p.Row >= rows {
			return fmt.Errorf("kernels: pick %d of row %d of %d", i, p.Row, rows)
		}
		kmax = max(kmax, k)
		u := math.Float64bits(p.U)
		args = append(args, int32(p.Row), int32(k), int32(math.Float32bits(p.Temperature)), int32(uint32(u)), int32(uint32(u>>32)))
	}
	partial, final := b.function("sample_partial_rows"), b.function("sample_final_rows")
	if partial == 0 || final == 0 {
		return b.takeErr()
	}
	b.sampleMu.Lock()
	defer b.sampleMu.Unlock()
	need := len(picks) * sampleBlocks * kmax
	if b.sample.rowsLen < need {
		cand, err := b.alloc(2 * 4 * need)
		if err != nil {
			return err
		}
		b.sample.rows, b.sample.rowsLen = cand, need
	}
	if b.sample.idsLen < len(picks) {
		out, err := b.alloc(4 * len(picks))
		if err != nil {
			return err
		}
		b.sample.ids, b.sample.idsLen = out, len(picks)
	}
	candv := b.sample.rows.ptr
	candi := candv + 4*uint64(need)
	b.qmu.Lock()
	at, ok := b.stepIDs(args)
	if !ok {
		b.qmu.Unlock()
		return fmt.Errorf("kernels: %d picks take more step values than there are", len(picks))
	}
	b.q.keep = append(b.q.keep, logits, b.sample.rows, b.sample.ids)
	o := op{kind: opKernel, name: "sample_partial_rows", fn: partial, grid: [3]uint32{sampleBlocks, uint32(len(picks)), 1},
		block: 256, shared: uint32(9 * chunk), pdl: pdlKernel("sample_partial_rows")}
	o.setParams(ptr(logits), vocab, chunk, kmax, candv, candi, b.dyn.ptr, int(at-b.dyn.ptr)/4)
	b.push(o)
	o = op{kind: opKernel, name: "sample_final_rows", fn: final, grid: [3]uint32{uint32(len(picks)), 1, 1},
		block: 256, shared: uint32(9 * sampleBlocks * kmax), pdl: pdlKernel("sample_final_rows")}
	o.setParams(candv, candi, kmax, b.dyn.ptr, int(at-b.dyn.ptr)/4, b.sample.ids.ptr)
	b.push(o)
	b.qmu.Unlock()
	got := make([]int32, len(picks))
	b.onContext(func() {
		b.setErr(b.d.check("cuMemcpyDtoH", b.d.cuMemcpyDtoH(unsafe.Pointer(&got[0]), b.sample.ids.ptr, uintptr(4*len(got)))))
	})
	runtime.KeepAlive(logits)
	if err := b.Sync(); err != nil {
		return err
	}
	for i, id := range got {
		v, err := pickedID(id)
		if err != nil {
			return fmt.Errorf("kernels: pick %d (row %d): %w", i, picks[i].Row, err)
		}
		ids[i] = v
	}
	return nil
}
