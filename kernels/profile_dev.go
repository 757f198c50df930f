//go:build manifold_dev

package kernels

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"
)

// attn_decode's trace layout, the same numbers as decode.cuh's ATTD_TR_*
// (TestAttnTraceLayout reads them there): attnTraceHead words of per-block
// launch counters, then [attnTraceLaunches][attnTraceBlocks][8] words.
const (
	attnTraceLaunches = 64   // ATTD_TR_LAUNCHES
	attnTraceBlocks   = 1024 // ATTD_TR_BLOCKS
	attnTraceHead     = 512  // ATTD_TR_HEAD: attnTraceBlocks 32-bit counters
	attnTraceWords    = attnTraceHead + attnTraceLaunches*attnTraceBlocks*8
	attnTraceWaited   = 1 // ATTD_TR_WAITED: the slot every other is timed from
	attnTraceSM       = 7 // ATTD_TR_SM: the block's multiprocessor, not a time
)

// StartAttnTrace makes the attn_decode launches queued from now until
// StopAttnTrace write, per block, the global timer at fixed points of the
// kernel (decode.cuh: ATTD_TR_*): where the one-row attention's time goes
// inside a decode step. A benchmark's tool, in the dev build with the dev
// image (decode.cuh records only with MANIFOLD_DEV): trace one step (its
// launches share one grid shape), launched op by op.
func (b *Backend) StartAttnTrace() error {
	a, err := b.alloc(8 * attnTraceWords)
	if err != nil {
		return err
	}
	b.onContext(func() { b.exp.attnRec = a }) // what was queued before is launched untraced
	return nil
}

// StopAttnTrace ends the trace and summarizes it: per launch, in us from
// the moment its first block's wait returned (the previous kernel
// complete), the blocks' entry (min / median / max), how many entered after
// that moment, then the median / max over blocks of when q was read, the
// first chunk of keys had arrived, the last chunk was done, the merge's
// partials were stored and the block wrote its last; and the time since
// the previous launch's release (the layer's period).
func (b *Backend) StopAttnTrace() (string, error) {
	raw := make([]uint64, attnTraceWords)
	err := errors.New("kernels: StopAttnTrace without StartAttnTrace")
	b.onContext(func() { // the traced launches queued, then read back
		a := b.exp.attnRec
		if a == nil {
			return
		}
		b.exp.attnRec = nil
		err = b.d.check("cuStreamSynchronize", b.d.cuStreamSynchronize(b.stream))
		if err == nil {
			err = b.d.check("cuMemcpyDtoH", b.d.cuMemcpyDtoH(unsafe.Pointer(&raw[0]), a.ptr, uintptr(8*len(raw))))
		}
	})
	if err != nil {
		return "", err
	}
	count := func(lb int) int { return int(uint32(raw[lb/2] >> (32 * (lb % 2)))) }
	grid := 0
	for grid < attnTraceBlocks && count(grid) > 0 {
		grid++
	}
	if grid == 0 {
		return "", errors.New("kernels: no attn_decode launch was traced")
	}
	launches := min(count(0), attnTraceLaunches)
	rec := func(l, lb, slot int) uint64 { return raw[attnTraceHead+(l*attnTraceBlocks+lb)*8+slot] }
	var sb strings.Builder
	names := []string{"entry", "waited", "q", "chunk", "loop", "merge", "end"} // slots 0 .. attnTraceSM-1
	median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	var prev uint64
	meds, maxes := make([][]float64, len(names)), make([][]float64, len(names)) // per slot, one per launch
	for l := range launches {
		ref := uint64(1<<64 - 1)
		for lb := range grid {
			if t := rec(l, lb, attnTraceWaited); t != 0 {
				ref = min(ref, t)
			}
		}
		sms := map[uint64]bool{}
		late := 0
		fmt.Fprintf(&sb, "RESULT attn_trace launch=%d blocks=%d", l, grid)
		for slot, name := range names {
			var v []float64
			for lb := range grid {
				if t := rec(l, lb, slot); t != 0 {
					v = append(v, float64(int64(t-ref))/1e3)
				}
			}
			if len(v) == 0 {
				continue
			}
			slices.Sort(v)
			med, hi := v[len(v)/2], v[len(v)-1]
			meds[slot], maxes[slot] = append(meds[slot], med), append(maxes[slot], hi)
			if slot == 0 {
				for _, x := range v {
					if x > 0 {
						late++
					}
				}
				fmt.Fprintf(&sb, " entry=%.2f/%.2f/%.2f late=%d", v[0], med, hi, late)
				continue
			}
			fmt.Fprintf(&sb, " %s=%.2f/%.2f", name, med, hi)
		}
		for lb := range grid {
			sms[rec(l, lb, attnTraceSM)] = true
		}
		fmt.Fprintf(&sb, " sms=%d", len(sms))
		if l > 0 {
			fmt.Fprintf(&sb, " period=%.2f", float64(int64(ref-prev))/1e3)
		}
		prev = ref
		sb.WriteString("\n")
	}
	fmt.Fprintf(&sb, "RESULT attn_trace_median launches=%d blocks=%d", launches, grid)
	for slot, name := range names {
		if len(meds[slot]) == 0 {
			continue
		}
		fmt.Fprintf(&sb, " %s=%.2f/%.2f", name, median(meds[slot]), median(maxes[slot]))
	}
	sb.WriteString("\n")
	return sb.String(), nil
}
