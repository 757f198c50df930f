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
// serializes its users.
type sampler struct {
	cand *allocation // sampleBlocks*MaxSampleTopK floats, then as many ints
	out  *allocation // one int
}

// SampleToken picks the next token on the device (see backend.TokenSampler);
// four bytes come back.
func (b *Backend) SampleToken(logits backend.Buffer, temperature float32, topK int, u float64) (int, error) {
	n := logits.Len()
	if n == 0 {
		return 0, fmt.Errorf("kernels: sampling from no logits")
	}
	k := 1
	if temperature > 0 {
		if topK <= 0 || topK > backend.MaxSampleTopK {
			return 0, fmt.Errorf("kernels: top-k %d outside [1, %d]", topK, backend.MaxSampleTopK)
		}
		k = topK
	}
	b.sampleMu.Lock()
	defer b.sampleMu.Unlock()
	// Launch what is queued (a decode step) before queueing the sampler, whose
	// draw u changes every step: the step then replays as one graph (queue.go).
	b.onContext(func() {})
	if b.sample.cand == nil {
		var err error
		if b.sample.cand, err = b.alloc(2 * 4 * sampleBlocks * backend.MaxSampleTopK); err != nil {
			return 0, err
		}
		if b.sample.out, err = b.alloc(4); err != nil {
			return 0, err
		}
	}
	candv := b.sample.cand.ptr
	candi := candv + 4*sampleBlocks*backend.MaxSampleTopK
	chunk := (n + sampleBlocks - 1) / sampleBlocks
	if 9*chunk > samplePartialShared {
		return 0, fmt.Errorf("kernels: a vocabulary of %d is too large for the device sampler", n)
	}
	b.launch("sample_partial", [3]int{sampleBlocks, 1, 1}, 256, chunk*9, ptr(logits), n, chunk, k, candv, candi)
	m := sampleBlocks * k
	b.launch("sample_final", [3]int{1, 1, 1}, 256, m*9, candv, candi, m, k, temperature, u, b.sample.out.ptr)
	var id int32
	b.onContext(func() {
		b.setErr(b.d.check("cuMemcpyDtoH", b.d.cuMemcpyDtoH(unsafe.Pointer(&id), b.sample.out.ptr, 4)))
	})
	runtime.KeepAlive(logits)
	if err := b.Sync(); err != nil {
		return 0, err
	}
	return int(id), nil
}
