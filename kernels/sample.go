package kernels

import (
	"fmt"
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
