package convert

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/manifoldlm/manifold/quant"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/nvfp4ckpt"
)

// Options configure a conversion.
type Options struct {
	In, Out     string   // source checkpoint directory; output directory (must not exist, nor lie inside In)
	Exclude     []string // modules (names or path.Match patterns) to keep in BF16
	ShardBytes  int64    // maximum tensor bytes per output shard
	Workers     int      // goroutines for the numeric work; <= 0: GOMAXPROCS
	Progress    io.Writer
	ProgressTTY bool // redraw one line (\r) instead of printing a line every 10%

	// Check, when set, runs on the finished output folder before it is
	// published (cmd/convert loads it as the engine would): an error fails
	// the conversion, and nothing is published.
	Check func(dir string) error

	// afterTensor, when set (tests), runs after each output tensor is written;
	// an error aborts the conversion.
	afterTensor func(i int, name string) error
}

// ErrOutputExists: the output directory already exists.
var ErrOutputExists = errors.New("output already exists")

// ErrOutputInInput: the output directory would lie inside the input's.
var ErrOutputInInput = errors.New("output inside the input folder")

// ErrAlreadyQuantized: the input is already an NVFP4 checkpoint.
var ErrAlreadyQuantized = errors.New("input is already NVFP4-quantized")

// plan is one source tensor and what to do with it.
type plan struct {
	t      *weights.Tensor
	kind   kind
	module string // for kindQuantize and 2-D linears kept in BF16
	bytes  int64  // source bytes (with consumed scales), for progress
	note   string // why a linear-shaped tensor stays BF16
}

// outputInside reports whether out, which does not exist yet, would lie in
// the input's folder (in itself, or in's folder when in is a file), symbolic
// links resolved as far as the path exists, and returns that folder.
func outputInside(in, out string) (string, bool) {
	inDir := in
	if st, err := os.Stat(in); err == nil && !st.IsDir() {
		inDir = filepath.Dir(in)
	}
	inDir, err := filepath.EvalSymlinks(inDir)
	if err != nil {
		return "", false // Open reports a missing input
	}
	inDir, err = filepath.Abs(inDir)
	if err != nil {
		return "", false
	}
	// The deepest existing ancestor of out, resolved, then the rest of out.
	abs, err := filepath.Abs(out)
	if err != nil {
		return "", false
	}
	rest := ""
	for dir := abs; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			abs = filepath.Join(r, rest)
			break
		}
		if filepath.Dir(dir) == dir {
			break
		}
		rest = filepath.Join(filepath.Base(dir), rest)
	}
	rel, err := filepath.Rel(inDir, abs)
	return inDir, err == nil && filepath.IsLocal(rel)
}

// Convert converts opts.In to NVFP4 in opts.Out (see the package comment).
// It writes into a temporary directory beside opts.Out and renames it at the
// end; on any error, or when ctx is cancelled, it removes the temporary
// directory and opts.Out does not exist. Before it starts, it removes the
// temporary directories of earlier conversions to the same name that were
// killed (Report.StaleRemoved; see removeStale).
func Convert(ctx context.Context, opts Options) (rep *Report, err error) {
	start := time.Now()
	if opts.ShardBytes <= 0 {
		opts.ShardBytes = 5 << 30
	}
	workers := opts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if _, err := os.Lstat(opts.Out); err == nil {
		return nil, fmt.Errorf("convert: %s: %w (refusing to overwrite; remove it or pick another -out)", opts.Out, ErrOutputExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if inDir, inside := outputInside(opts.In, opts.Out); inside {
		return nil, fmt.Errorf("convert: %s: %w %s (it would add files there; pick an -out outside it)", opts.Out, ErrOutputInInput, inDir)
	}
	srcCfg, err := nvfp4ckpt.ReadConfig(opts.In)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	blk := [2]int{128, 128}
	switch {
	case srcCfg == nil:
	case srcCfg.Algo == nvfp4ckpt.AlgoFP8Block:
		blk = srcCfg.BlockSize
	default:
		return nil, fmt.Errorf("convert: %s: %w (quant_algo %s)", srcCfg.File, ErrAlreadyQuantized, srcCfg.Algo)
	}
	excl := &nvfp4ckpt.Config{Algo: nvfp4ckpt.AlgoNVFP4, Exclude: opts.Exclude}
	for _, p := range opts.Exclude {
		if _, err := filepath.Match(p, ""); err != nil {
			return nil, fmt.Errorf("convert: exclude pattern %q: %w", p, err)
		}
	}

	c, err := weights.Open(opts.In)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	defer c.Close()

	plans, sources, err := makePlans(c, excl, blk, srcCfg != nil)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}

	// Output goes to a temporary sibling directory, renamed at the end.
	parent := filepath.Dir(filepath.Clean(opts.Out))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	removed, left := removeStale(parent, opts.Out, opts.Progress)
	tmp, unlock, err := makeTemp(parent, opts.Out)
	if err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	defer unlock()
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()

	rep = &Report{In: opts.In, Out: opts.Out, Workers: workers, StaleRemoved: removed, StaleLeft: left}
	for _, p := range plans {
		rep.SourceBytes += p.bytes
		rep.LargestSource = max(rep.LargestSource, p.bytes)
	}
	mem := startMemSampler()
	defer mem.stop()
	prog := newProgress(opts.Progress, opts.ProgressTTY, rep.SourceBytes)

	sw := weights.NewShardedWriter(tmp, opts.ShardBytes, map[string]string{"format": "pt"})
	w := newAsyncWriter(sw)
	closed := false
	defer func() {
		if !closed {
			w.finish()
			sw.Close()
		}
	}()
	var quantizedModules, keptModules []string
	for i, p := range plans {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("convert: interrupted: %w", err)
		}
		prog.update(p.t.Name)
		var out int64
		switch p.kind {
		case kindQuantize:
			st, n, err := quantizeTensor(w, sources[i], p.module, workers, mem)
			if err != nil {
				return nil, err
			}
			rep.Stats = append(rep.Stats, st)
			rep.QuantizedParams += int64(sources[i].rows * sources[i].cols)
			quantizedModules = append(quantizedModules, p.module)
			out = n
		case kindBF16:
			n, err := bf16Tensor(w, sources[i], workers, mem)
			if err != nil {
				return nil, err
			}
			rep.KeptBF16++
			if p.module != "" {
				keptModules = append(keptModules, p.module)
				if p.note != "" {
					rep.Unquantizable = append(rep.Unquantizable, p.t.Name+": "+p.note)
				}
			}
			out = n
		case kindReblock:
			n, err := reblockMXFP4(w, c, p, workers, mem, rep)
			if err != nil {
				return nil, err
			}
			quantizedModules = append(quantizedModules, p.module)
			out = n
		case kindCopy:
			if err := w.Add(p.t.Name, p.t.DType, p.t.Shape, p.t.Data); err != nil {
				return nil, err
			}
			rep.Copied++
			out = int64(len(p.t.Data))
		case kindConsumed:
			continue
		}
		rep.OutputBytes += out
		prog.add(p.bytes, p.t.Name)
		if opts.afterTensor != nil {
			if err := opts.afterTensor(i, p.t.Name); err != nil {
				return nil, fmt.Errorf("convert: %w", err)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("convert: interrupted: %w", err)
	}
	closed = true
	if err := w.finish(); err != nil {
		sw.Close()
		return nil, fmt.Errorf("convert: %w", err)
	}
	if err := sw.Close(); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	prog.finish()

	rep.Exclude = excludeList(keptModules, quantizedModules)
	if err := writeConfigs(opts.In, tmp, rep.Exclude); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("convert: interrupted: %w", err)
	}
	if opts.Check != nil {
		if err := opts.Check(tmp); err != nil {
			return nil, fmt.Errorf("convert: the converted checkpoint would not load: %w", err)
		}
	}
	// The lock file goes before the rename (the lock itself is held until
	// Convert returns): a folder without one is never removed by another run.
	if err := os.Remove(filepath.Join(tmp, lockName)); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if err := publishModes(tmp); err != nil {
		return nil, fmt.Errorf("convert: %w", err)
	}
	if err := os.Rename(tmp, opts.Out); err != nil {
		return nil, fmt.Errorf("convert: publishing %s: %w", opts.Out, err)
	}
	rep.Elapsed = time.Since(start)
	rep.PeakHeap = mem.stop()
	rep.MaxRSS = maxRSS()
	return rep, nil
}

// publishModes gives the output directory and its files ordinary
// permissions (temporary files and directories are created private).
func publishModes(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type().IsRegular() {
			if err := os.Chmod(filepath.Join(dir, e.Name()), 0o644); err != nil {
				return err
			}
		}
	}
	return os.Chmod(dir, 0o755)
}

// makePlans classifies every tensor of c and checks dtypes and FP8 and
// MXFP4 scales before anything is written. In a quantized source
// (quantized: DeepSeek's FP8 releases) float32 tensors other than linears
// are kept in float32, as their authors stored them (V4's mHC parameters,
// sinks and router bias).
func makePlans(c *weights.Checkpoint, excl *nvfp4ckpt.Config, blk [2]int, quantized bool) ([]plan, []*source, error) {
	names := c.Names()
	plans := make([]plan, len(names))
	sources := make([]*source, len(names))
	consumed, unclaimed := make(map[string]bool), make(map[string]bool)
	for i, name := range names {
		t, err := c.Tensor(name)
		if err != nil {
			return nil, nil, err
		}
		s := newSource(t)
		p := plan{t: t, bytes: int64(len(t.Data))}
		module, mx := strings.CutSuffix(name, nvfp4ckpt.SuffixWeight)
		mx = mx && nvfp4ckpt.IsMXFP4(c, module)
		switch {
		case mx:
			if _, err := nvfp4ckpt.LoadMXFP4(c, module); err != nil {
				return nil, nil, err
			}
			sc, _ := c.Tensor(module + nvfp4ckpt.SuffixScale)
			p.kind, p.module = kindReblock, module
			p.bytes += int64(len(sc.Data))
			consumed[module+nvfp4ckpt.SuffixScale] = true
		case isInteger(t.DType):
			p.kind = kindCopy
		case quantized && t.DType == weights.F32 && keepF32.MatchString(name):
			p.kind = kindCopy
		case isFloat(t.DType):
			if t.DType == weights.F8E4M3 {
				if err := s.attachFP8Scales(c, blk); err != nil {
					return nil, nil, err
				}
				consumed[fp8ScaleName(c, name)] = true
				p.bytes += s.extraBytes
			}
			p.kind = kindBF16
			if module, ok := isLinearWeight(name, t.Shape); ok {
				switch {
				case excl.Excluded(module):
					p.module = module
				case t.Shape[1]%quant.NVFP4BlockSize != 0:
					p.module, p.note = module, fmt.Sprintf("K = %d is not a multiple of 16", t.Shape[1])
				default:
					p.kind, p.module = kindQuantize, module
				}
			} else if len(t.Shape) == 2 && strings.HasSuffix(name, ".weight") {
				p.module = strings.TrimSuffix(name, ".weight") // embeddings, heads, gates: listed as excluded
			}
		default:
			if t.DType == weights.F8E8M0 && strings.HasSuffix(name, nvfp4ckpt.SuffixScale) {
				plans[i], sources[i] = plan{t: t, kind: kindConsumed}, s // its weight claims it, or it is reported below
				unclaimed[name] = true
				continue
			}
			return nil, nil, &weights.Error{File: t.File, Tensor: name, Err: fmt.Errorf("%w %s (the converter reads F32, BF16, F16, F64, F8_E4M3 with weight_scale_inv or scale, MXFP4 (I8 with an F8_E8M0 scale), and integer tensors)",
				nvfp4ckpt.ErrUnsupportedDType, t.DType)}
		}
		plans[i], sources[i] = p, s
	}
	// The block scales of FP8 and MXFP4 weights are folded into them, not
	// written; a *_scale_inv that no FP8 weight claims is an ordinary tensor,
	// an F8_E8M0 scale that none claims an error.
	for i, p := range plans {
		switch {
		case consumed[p.t.Name]:
			plans[i].kind, plans[i].bytes = kindConsumed, 0
		case unclaimed[p.t.Name]:
			return nil, nil, &weights.Error{File: p.t.File, Tensor: p.t.Name, Err: fmt.Errorf("%w: an F8_E8M0 scale that no FP8 or MXFP4 weight claims", nvfp4ckpt.ErrBadTensor)}
		}
	}
	return plans, sources, nil
}

// quantizeTensor quantizes a linear weight to NVFP4 in two passes over the
// source (amax, then blocks), decoding a chunk of rows at a time per worker,
// and writes <module>.weight, .weight_scale and .weight_scale_2. It returns
// the accuracy figures and the bytes written.
func quantizeTensor(w adder, s *source, module string, workers int, mem *memSampler) (TensorStat, int64, error) {
	rows, cols := s.rows, s.cols
	chunk := s.rowChunk()
	var mu sync.Mutex
	var amax float32
	finite := true
	quant.ParallelRows(rows, workers, func(r0, r1 int) {
		mx, ok := s.absMaxRows(r0, r1)
		mu.Lock()
		amax, finite = max(amax, mx), finite && ok
		mu.Unlock()
	})
	if !finite {
		return TensorStat{}, 0, &weights.Error{File: s.t.File, Tensor: s.t.Name, Err: fmt.Errorf("%w: NaN or Inf among the weights", quant.ErrNonFinite)}
	}
	nb := cols / quant.NVFP4BlockSize
	m := &quant.NVFP4{
		Rows: rows, Cols: cols,
		Packed:      make([]byte, rows*cols/2),
		Scales:      make([]byte, rows*nb),
		GlobalScale: quant.NVFP4GlobalScale(amax),
	}
	var errSq, refSq float64
	quant.ParallelRows(rows, workers, func(r0, r1 int) {
		buf := make([]float32, min(chunk, r1-r0)*cols)
		var e, r float64
		for a := r0; a < r1; a += chunk {
			b := min(a+chunk, r1)
			s.decodeRows(buf, a, b)
			sub := &quant.NVFP4{Rows: b - a, Cols: cols, Packed: m.Packed[a*cols/2 : b*cols/2],
				Scales: m.Scales[a*nb : b*nb], GlobalScale: m.GlobalScale}
			de, dr := sub.QuantizeRowsError(buf, 0, b-a)
			e, r = e+de, r+dr
		}
		mu.Lock()
		errSq, refSq = errSq+e, refSq+r
		mu.Unlock()
	})
	mem.sample() // the output is complete: the heap is at its peak for this tensor
	n, err := writeNVFP4(w, module, m)
	if err != nil {
		return TensorStat{}, 0, err
	}
	return statOf(module, rows, cols, errSq, refSq), n, nil
}

// statOf is the accuracy of module's quantized [rows, cols] weight.
func statOf(module string, rows, cols int, errSq, refSq float64) TensorStat {
	rel := 0.0
	if refSq > 0 {
		rel = math.Sqrt(errSq / refSq)
	}
	return TensorStat{Name: module + nvfp4ckpt.SuffixWeight, Shape: []int{rows, cols}, RelRMS: rel, ErrSq: errSq, RefSq: refSq}
}

// bf16Tensor writes a float tensor as BF16 (BF16 sources are copied as is).
func bf16Tensor(w adder, s *source, workers int, mem *memSampler) (int64, error) {
	t := s.t
	if t.DType == weights.BF16 {
		return int64(len(t.Data)), w.Add(t.Name, weights.BF16, t.Shape, t.Data)
	}
	out := make([]byte, 2*s.rows*s.cols)
	chunk := s.rowChunk()
	quant.ParallelRows(s.rows, workers, func(r0, r1 int) {
		buf := make([]float32, min(chunk, r1-r0)*s.cols)
		for a := r0; a < r1; a += chunk {
			b := min(a+chunk, r1)
			s.decodeRows(buf, a, b)
			quant.EncodeBF16(out[2*a*s.cols:2*b*s.cols], buf[:(b-a)*s.cols])
		}
	})
	mem.sample()
	return int64(len(out)), w.Add(t.Name, weights.BF16, t.Shape, out)
}

func putF32(b []byte, f float32) {
	u := math.Float32bits(f)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}

// excludeList returns the modules kept unquantized for exclude_modules,
// folding layer and expert indices into "*" where the pattern covers no
// quantized module.
func excludeList(kept, quantized []string) []string {
	qcfg := func(list []string) *nvfp4ckpt.Config {
		return &nvfp4ckpt.Config{Algo: nvfp4ckpt.AlgoNVFP4, Exclude: list}
	}
	seen := make(map[string]bool)
	var out []string
	for _, m := range kept {
		p := generalize(m)
		if p != m {
			cfg := qcfg([]string{p})
			for _, q := range quantized {
				if cfg.Excluded(q) {
					p = m
					break
				}
			}
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	sort.Strings(out)
	return out
}

// generalize replaces purely numeric name components with "*".
func generalize(module string) string {
	parts := strings.Split(module, ".")
	for i, p := range parts {
		if p != "" && strings.Trim(p, "0123456789") == "" {
			parts[i] = "*"
		}
	}
	return strings.Join(parts, ".")
}

// adder is where finished tensors go.
type adder interface {
	Add(name string, dtype weights.DType, shape []int, data []byte) error
}

// asyncWriter hands tensors to a ShardedWriter on its own goroutine, so
// writing one tensor overlaps computing the next. At most a few tensors wait
// in the queue. Add returns the first write error seen so far; finish waits
// for the queue to drain and returns it.
type asyncWriter struct {
	queue chan pending
	done  chan struct{}
	mu    sync.Mutex
	err   error
	once  sync.Once
}

type pending struct {
	name  string
	dtype weights.DType
	shape []int
	data  []byte
}

func newAsyncWriter(w *weights.ShardedWriter) *asyncWriter {
	a := &asyncWriter{queue: make(chan pending, 3), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for p := range a.queue {
			if a.firstErr() != nil {
				continue // drain
			}
			if err := w.Add(p.name, p.dtype, p.shape, p.data); err != nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
			}
		}
	}()
	return a
}

func (a *asyncWriter) firstErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

// Add queues a tensor; data must not change afterwards.
func (a *asyncWriter) Add(name string, dtype weights.DType, shape []int, data []byte) error {
	if err := a.firstErr(); err != nil {
		return err
	}
	a.queue <- pending{name, dtype, shape, data}
	return nil
}

// finish drains the queue and returns the first write error.
func (a *asyncWriter) finish() error {
	a.once.Do(func() { close(a.queue) })
	<-a.done
	return a.firstErr()
}

// memSampler tracks the peak of the Go heap (live and unswept objects).
type memSampler struct {
	peak atomic.Uint64
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

func startMemSampler() *memSampler {
	m := &memSampler{quit: make(chan struct{})}
	m.sample()
	m.wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-m.quit:
				return
			case <-t.C:
				m.sample()
			}
		}
	})
	return m
}

func (m *memSampler) sample() {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		v := s[0].Value.Uint64()
		for {
			old := m.peak.Load()
			if v <= old || m.peak.CompareAndSwap(old, v) {
				break
			}
		}
	}
}

// stop ends sampling and returns the peak in bytes.
func (m *memSampler) stop() uint64 {
	m.once.Do(func() {
		m.sample()
		close(m.quit)
		m.wg.Wait()
	})
	return m.peak.Load()
}
