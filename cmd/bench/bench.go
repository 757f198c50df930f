package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
)

// result is one test's row (the JSON output's objects).
type result struct {
	Model       string  `json:"model"`
	Description string  `json:"description,omitempty"` // a random shape's
	Dir         string  `json:"dir"`
	Random      bool    `json:"random"`
	ModelType   string  `json:"model_type"`
	Layers      int     `json:"layers"`
	SizeBytes   int64   `json:"size_bytes"` // the checkpoint's tensor data
	Device      string  `json:"device"`
	LoadSeconds float64 `json:"load_s"`

	Test    string    `json:"test"` // ppP or tgN
	Prompt  int       `json:"n_prompt"`
	Gen     int       `json:"n_gen"`
	Reps    int       `json:"reps"`
	TokS    float64   `json:"tok_s"` // the median
	Best    float64   `json:"tok_s_best"`
	Stddev  float64   `json:"tok_s_stddev"` // the sample standard deviation
	Samples []float64 `json:"tok_s_samples"`

	// CopyBandwidth is bytes read + bytes written per second (0: not measured).
	CopyBandwidth float64 `json:"copy_bytes_per_s"`

	// Decode (tg) rows only: the bytes a step reads and the floor.
	BytesPerToken   int64   `json:"bytes_per_token,omitempty"`
	WeightBytes     int64   `json:"weight_bytes_per_token,omitempty"`
	EmbedRowBytes   int64   `json:"embedding_row_bytes,omitempty"`
	KVBytes         int64   `json:"kv_bytes_per_token,omitempty"`
	KVBytesPerPos   int64   `json:"kv_bytes_per_position,omitempty"`
	MeanContext     float64 `json:"mean_context,omitempty"`
	RoutedExperts   string  `json:"routed_experts,omitempty"`
	FloorTokS       float64 `json:"floor_tok_s,omitempty"`
	FloorShare      float64 `json:"of_floor,omitempty"`
	copyDescription string
}

// run benchmarks the model o names and writes the report to stdout.
func run(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if err := o.check(); err != nil {
		return err
	}
	dir, name, desc := o.model, "", ""
	if o.random != "" {
		spec, _ := o.shape() // check found it
		d, cleanup, err := randomCheckpoint(ctx, spec, o.keep, stderr)
		if err != nil {
			return err
		}
		defer cleanup()
		dir, name, desc = d, spec.Name, spec.Description
	} else {
		if fi, err := os.Stat(dir); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("-model %s: no such folder", dir)
			}
			return fmt.Errorf("-model %s: %w", dir, err)
		} else if !fi.IsDir() {
			return fmt.Errorf("-model %s: not a folder (give the folder holding config.json and the safetensors)", dir)
		}
		if abs, err := filepath.Abs(dir); err == nil {
			name = filepath.Base(abs)
		}
	}
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return fmt.Errorf("-model %s: %w", dir, err)
	}
	// The tg test runs after a prompt of base tokens; Generate needs one
	// position past the last token generated.
	base := o.prompt
	positions := o.prompt
	if o.gen > 0 {
		base = max(o.prompt, 1)
		positions = base + o.gen + 1
	}
	if limit := cfg.MaxPositionEmbeddings; limit > 0 && positions > limit {
		return fmt.Errorf("-p %d and -n %d need %d positions (prompt, generated tokens and one more), past the model's context of %d (max_position_embeddings in %s)",
			o.prompt, o.gen, positions, limit, cfg.Path)
	}
	wb, err := countWeights(dir, cfg)
	if err != nil {
		return fmt.Errorf("-model %s: %w", dir, err)
	}

	fmt.Fprintf(stderr, "bench: loading %s (device %s)\n", dir, o.device)
	m, err := engine.Load(dir, engine.Options{Device: o.device, Threads: o.threads, ContextLength: positions,
		GPU: kernels.Options{NoCuBLAS: o.noCuBLAS}})
	if err != nil {
		if errors.Is(err, engine.ErrDevice) {
			return fmt.Errorf("-device %s: %w", o.device, err)
		}
		return err
	}
	defer m.Close()
	if m.Device() != m.Backend().Name() {
		fmt.Fprintf(stderr, "bench: device %s\n", m.Device())
	}
	s, err := m.NewSession(0)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	bw, bwDesc := copyBandwidth(m, o, stderr)

	row := result{Model: name, Description: desc, Dir: dir, Random: o.random != "", ModelType: cfg.ModelType,
		Layers: cfg.NumLayers, SizeBytes: wb.checkpoint, Device: m.Backend().Name(),
		LoadSeconds: m.LoadTime().Seconds(), Reps: o.reps, CopyBandwidth: bw, copyDescription: bwDesc}
	prompt := make([]int, base)
	for i := range prompt {
		prompt[i] = (i*7919 + 13) % cfg.VocabSize
	}
	var results []result

	if o.prompt > 0 {
		pp := func() (float64, error) {
			s.Truncate(0)
			start := time.Now()
			if _, err := s.Append(ctx, prompt); err != nil {
				return 0, err
			}
			return float64(len(prompt)) / time.Since(start).Seconds(), nil
		}
		r := row
		r.Test, r.Prompt = fmt.Sprintf("pp%d", o.prompt), o.prompt
		if r.Samples, err = repeat(o, stderr, r.Test, pp); err != nil {
			return err
		}
		results = append(results, r.summarize())
	}

	if o.gen > 0 {
		s.Truncate(0)
		if _, err := s.Append(ctx, prompt); err != nil {
			return err
		}
		tg := func(n int) func() (float64, error) {
			return func() (float64, error) {
				s.Truncate(base)
				res, err := s.Generate(ctx, nil, engine.GenerateOptions{MaxTokens: n + 1, StopTokens: []int{}}, nil)
				if err != nil {
					return 0, err
				}
				if len(res.Tokens) != n+1 {
					return 0, fmt.Errorf("tg%d: generated %d tokens (%s), want %d", n, len(res.Tokens), res.Reason, n+1)
				}
				return float64(n) / res.DecodeDuration.Seconds(), nil
			}
		}
		r := row
		r.Test, r.Prompt, r.Gen = fmt.Sprintf("tg%d", o.gen), o.prompt, o.gen
		warm := tg(min(o.gen, 16)) // a short warm-up: the rate does not depend on it
		if r.Samples, err = repeat(o, stderr, r.Test, tg(o.gen), warm); err != nil {
			return err
		}
		r.WeightBytes, r.EmbedRowBytes, r.RoutedExperts = wb.perToken, wb.embedRow, wb.experts
		r.KVBytesPerPos = s.CacheBytesPerToken()
		r.MeanContext = float64(base) + float64(o.gen+1)/2
		r.KVBytes = int64(math.Round(float64(r.KVBytesPerPos) * r.MeanContext))
		r.BytesPerToken = r.WeightBytes + r.EmbedRowBytes + r.KVBytes
		r = r.summarize()
		if bw > 0 && r.BytesPerToken > 0 {
			r.FloorTokS = bw / float64(r.BytesPerToken)
			r.FloorShare = r.TokS / r.FloorTokS
		}
		results = append(results, r)
		if o.profile {
			if err := profileDecode(ctx, m, s, base, stderr); err != nil {
				return err
			}
		}
	}
	s.Truncate(0)

	if o.output == "json" {
		return writeJSON(stdout, results)
	}
	return writeText(stdout, results)
}

// repeat runs the test (warm, or test itself, once first when o.warmup)
// o.reps times and returns its rates.
func repeat(o *options, stderr io.Writer, name string, test func() (float64, error), warm ...func() (float64, error)) ([]float64, error) {
	if o.warmup {
		w := test
		if len(warm) > 0 {
			w = warm[0]
		}
		if _, err := w(); err != nil {
			return nil, fmt.Errorf("%s (warm-up): %w", name, err)
		}
	}
	var rates []float64
	for i := range o.reps {
		r, err := test()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if math.IsInf(r, 0) || math.IsNaN(r) || r <= 0 {
			return nil, fmt.Errorf("%s: repetition %d timed at %v tokens/s", name, i+1, r)
		}
		rates = append(rates, r)
		fmt.Fprintf(stderr, "bench: %s %d/%d: %.2f tok/s\n", name, i+1, o.reps, r)
	}
	return rates, nil
}

// summarize sets the median, best and standard deviation from the samples.
func (r result) summarize() result {
	x := slices.Sorted(slices.Values(r.Samples))
	n := len(x)
	if n == 0 {
		return r
	}
	r.TokS = x[n/2]
	if n%2 == 0 {
		r.TokS = (x[n/2-1] + x[n/2]) / 2
	}
	r.Best = x[n-1]
	if n > 1 {
		var mean, ss float64
		for _, v := range x {
			mean += v / float64(n)
		}
		for _, v := range x {
			ss += (v - mean) * (v - mean)
		}
		r.Stddev = math.Sqrt(ss / float64(n-1))
	}
	return r
}

// copyBandwidth measures the copy bandwidth of the device m runs on (see
// the package doc), in bytes read + written per second, and says how; 0
// when it could not be measured (the reason goes to stderr).
func copyBandwidth(m *engine.Model, o *options, stderr io.Writer) (float64, string) {
	if gb, ok := m.Backend().(*kernels.Backend); ok {
		size := o.copyBytes
		for {
			bw, err := gb.MeasureCopyBandwidth(size)
			if err == nil {
				return bw, fmt.Sprintf("device-to-device copies of %d MiB, 20 between CUDA events", size>>20)
			}
			if size <= 64<<20 {
				fmt.Fprintf(stderr, "bench: copy bandwidth not measured (%v): no floor\n", err)
				return 0, ""
			}
			fmt.Fprintf(stderr, "bench: copy of %d MiB: %v; trying a quarter of it\n", size>>20, err)
			size /= 4
			runtime.GC() // a buffer allocated before the failure is freed by its cleanup
		}
	}
	threads := o.threads
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0) // as the CPU backend counts its threads
	}
	bw := cpuCopyBandwidth(o.copyBytes, threads, 5)
	return bw, fmt.Sprintf("%d threads copying %d MiB, best of 5", threads, o.copyBytes>>20)
}

// cpuCopyBandwidth copies a size-byte buffer into another reps times, each
// of threads goroutines copying its share (as backend/cpu's BenchmarkCopy
// splits it), and returns the best rate in bytes read + written per second.
func cpuCopyBandwidth(size, threads, reps int) float64 {
	src, dst := make([]byte, size), make([]byte, size)
	for i := 0; i < min(size, 4096); i++ {
		src[i] = byte(i)
	}
	for i := 4096; i < size; i *= 2 {
		copy(src[i:], src[:i])
	}
	const grain = 1 << 20
	chunks := max(1, min(threads, (size+grain-1)/grain))
	step := (size + chunks - 1) / chunks
	best := 0.0
	for range reps {
		start := time.Now()
		var wg sync.WaitGroup
		for lo := 0; lo < size; lo += step {
			hi := min(lo+step, size)
			wg.Add(1)
			go func() {
				defer wg.Done()
				copy(dst[lo:hi], src[lo:hi])
			}()
		}
		wg.Wait()
		if d := time.Since(start).Seconds(); d > 0 {
			best = max(best, 2*float64(size)/d)
		}
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	src, dst = nil, nil
	debug.FreeOSMemory() // the buffers' memory back before the tests
	return best
}

// profileDecode prints the device time of each kernel over 8 decode steps
// after base tokens (GPU only: the CPU has no per-kernel profile). The
// steps are launched kernel by kernel, as the profile times each launch.
func profileDecode(ctx context.Context, m *engine.Model, s *engine.Session, base int, stderr io.Writer) error {
	gb, ok := m.Backend().(*kernels.Backend)
	if !ok {
		fmt.Fprintf(stderr, "bench: -profile: no per-kernel profile on %s\n", m.Backend().Name())
		return nil
	}
	s.Truncate(base)
	gb.StartProfile()
	_, err := s.Generate(ctx, nil, engine.GenerateOptions{MaxTokens: 9, StopTokens: []int{}}, nil)
	p := gb.StopProfile()
	if err != nil {
		return fmt.Errorf("-profile: %w", err)
	}
	fmt.Fprintf(stderr, "bench: kernels of 8 decode steps (and the first token's sampling)\n%s", kernels.FormatProfile(p))
	return nil
}
