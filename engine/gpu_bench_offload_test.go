package engine

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
)

// BenchmarkDecodeDeepseekV4Offload measures batch-1 greedy decode of the
// DeepSeek-V4-shape model of BenchmarkDecodeDeepseekV4 (its checkpoint,
// MANIFOLD_BENCH_DIR and MANIFOLD_BENCH_V4_EXPERTS) on the GPU with its
// routed experts all on the device, half of them (whole layers first) and
// all of them in host memory, computed by the CPU backend, against each
// plan's floor: its device bytes a token at the measured copy bandwidth
// plus its host bytes at the measured host read bandwidth.
func BenchmarkDecodeDeepseekV4Offload(b *testing.B) {
	skipWithoutGPU(b)
	spec, dir := v4BenchCheckpoint(b)
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		b.Fatal(err)
	}
	hostBW := hostReadBandwidth()
	const prompt, tokens = 64, 32
	ctx := context.Background()
	for _, place := range []model.ExpertPlacement{
		{Mode: "device"},
		{Mode: "count", Count: spec.Experts * cfg.NumLayers / 2},
		{Mode: "host"},
	} {
		m, err := Load(dir, Options{Device: "cuda", ContextLength: 512, Experts: place})
		if err != nil {
			b.Fatal(err)
		}
		gb := m.Backend().(*kernels.Backend)
		plan := *m.ExpertPlan()
		plan.DeviceBandwidth, plan.HostBandwidth = gb.CopyBandwidth(), hostBW
		s, err := m.NewSession(0)
		if err != nil {
			b.Fatal(err)
		}
		next := benchPrefill(b, s, prompt)
		var per time.Duration
		for i := range tokens + 5 {
			if i == 5 {
				per = 0
			}
			start := time.Now()
			logits, err := s.Append(ctx, []int{next})
			if err != nil {
				b.Fatal(err)
			}
			per += time.Since(start)
			next = layers.Argmax(logits)
		}
		per /= tokens
		floor := plan.TokenSeconds()
		d, h := plan.TokenBytes()
		fmt.Printf("RESULT decodev4_offload mode=%s device_experts=%d host_experts=%d tok_s=%.2f floor_tok_s=%.2f of_floor=%.3f device_bytes=%.0f host_bytes=%.0f copy_GBps=%.0f host_GBps=%.1f threads=%d\n",
			place.Mode, plan.DeviceExperts(), plan.HostExperts(), 1/per.Seconds(), 1/floor, floor/per.Seconds(), d, h, plan.DeviceBandwidth/1e9, hostBW/1e9, runtime.GOMAXPROCS(0))
		b.Logf("%s", &plan)
		m.Close()
	}
}

// hostReadBandwidth is the best of three sweeps over 1 GiB of host memory
// by every core (bytes/s).
func hostReadBandwidth() float64 {
	buf := make([]uint64, 1<<27)
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := runtime.GOMAXPROCS(0)
	var best time.Duration
	var sink uint64
	for range 3 {
		var wg sync.WaitGroup
		sums := make([]uint64, workers)
		start := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lo, hi := len(buf)*w/workers, len(buf)*(w+1)/workers
				var s uint64
				for _, v := range buf[lo:hi] {
					s += v
				}
				sums[w] = s
			}()
		}
		wg.Wait()
		if d := time.Since(start); best == 0 || d < best {
			best = d
		}
		sink += sums[0]
	}
	runtime.KeepAlive(sink)
	return float64(8*len(buf)) / best.Seconds()
}
