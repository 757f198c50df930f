// Package engine is Manifold's public API: load a model folder (or the
// built-in model, package engine/builtin), open sessions that hold a KV
// cache, and generate tokens or text (Session.Generate, GenerateText, Chat,
// Stream) with sampling, stop conditions, log-probabilities, streaming and
// cancellation. Model.Info describes what was loaded.
//
// A Model is safe for concurrent use: each Session owns its cache and
// scratch memory, and sessions of one model share the weights. A Session is
// not safe for concurrent use. Model.Close may be called at any time from
// any goroutine, as database/sql's DB.Close may: later calls fail with
// ErrClosed, and the weights and the device are released when the last call
// in flight returns.
//
// The engine owns the choice of backend, sessions and sampling; the forward
// passes belong to package model and the kernels to the backends.
package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/kernels"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/tokenizer"
	"github.com/manifoldlm/manifold/weights"
)

// Options configure Load. The zero value loads on the best available device
// with every core and the model's full context (capped at DefaultContext).
// No environment variable changes what a model computes: these are the
// only knobs (README.md: Knobs).
type Options struct {
	// Device is "auto" (the default), "cpu" or "cuda".
	Device string
	// Threads is the number of CPU threads (0: one per core).
	Threads int
	// ContextLength is the default number of positions a session holds
	// (0: the model's max_position_embeddings, at most DefaultContext).
	ContextLength int
	// Attention chooses dense (the default) or htree attention for the
	// architectures that offer a choice (Llama, Qwen3); see docs/htree.md.
	Attention model.AttentionOptions
	// GPU schedules the CUDA backend's work: CUDA graphs (auto, on, off),
	// programmatic dependent launch, how many launches are queued before
	// the older ones start. Each of its values gives the same results
	// (kernels.Options); the zero value is the default of each.
	GPU kernels.Options
	// CopyWeights reads the checkpoint into memory at Load instead of
	// memory-mapping it (weights.OpenOptions.Copy). With a mapping (the
	// default), a weight file truncated while the model is loaded kills
	// the process with SIGBUS when the missing pages are read, and one
	// rewritten in place changes the weights under it; replacing a file by
	// renaming a new one over it is safe either way. A copy is immune, for
	// the cost of reading the files at Load and of keeping their size in
	// private memory (not shared page cache) until Close. For long-running
	// programs whose model folder may be rewritten.
	CopyWeights bool
	// Batch tunes the scheduler that runs the sessions generating at once
	// as one batched step (continuous batching); see BatchOptions.
	Batch BatchOptions
	// Speculative turns on speculative decoding with the model's MTP block
	// (DeepSeek-V4's mtp.0, DeepSeek-V3's), drafting Tokens tokens a step; see
	// SpeculativeOptions. Output is the same distribution (greedy: the
	// same tokens) either way.
	Speculative SpeculativeOptions
	// Experts places DeepSeek-V4's routed experts on the device or in host
	// memory, where the CPU computes them (model.ExpertPlacement; the zero
	// value plans from the GPU's free memory, all on the device on the
	// CPU). Its Host, when nil, is a CPU backend of Threads threads.
	// ExpertPlan reports the split and its expected cost.
	Experts model.ExpertPlacement
}

// DefaultContext caps the default session length, so that a model with a
// long max_position_embeddings does not allocate a huge cache by default.
const DefaultContext = 4096

// Model is a loaded model.
type Model struct {
	dir     string
	cfg     *model.Config
	gen     *model.GenerationConfig
	folder  *model.Folder // the folder, read once; holds the checkpoint's memory maps
	backend backend.Backend
	caps    backend.Capabilities // the backend's optional op groups, asked once
	net     model.Model
	tok     *tokenizer.Tokenizer // nil when the folder has no tokenizer.json
	// deviceNote says why "auto" did not take the GPU, when one is present.
	deviceNote string
	ctxLen     int
	loadTime   time.Duration
	// cacheBytesPerToken is what each position of a session's caches costs,
	// found once from a one-position state when first needed (fits; the
	// state is dropped).
	cacheBytesPerToken func() (int64, error)
	// info holds Info's figures of the checkpoint, taken at Load.
	info Info
	// tokenBytesState holds each token's text for constraints (constrain.go).
	tokenBytesState
	// sched batches the steps of concurrent sessions (nil: the model does
	// not batch, or Options.Batch.Off).
	sched *scheduler
	// specOpts are Options.Speculative; spec counts its steps (under mu).
	specOpts SpeculativeOptions
	spec     SpeculativeStats

	// mu guards the lifecycle: closed is set by Close, inflight counts the
	// calls using the weights or the backend, and the last of them to
	// return after Close releases both (release), as does Close when none
	// is in flight.
	mu       sync.Mutex
	closed   bool
	inflight int
	freed    bool
}

// ErrDevice is returned when the requested device cannot be used.
var ErrDevice = errors.New("device not available")

// ErrClosed is wrapped by the error of every call that needs the weights or
// the device (NewSession, Session.Append, Session.Generate and the calls
// built on them) made after Model.Close; test with errors.Is.
var ErrClosed = errors.New("model closed")

// Load reads the model folder dir (config.json, generation_config.json and a
// safetensors checkpoint, single or sharded) onto the device opts ask for.
func Load(dir string, opts Options) (*Model, error) {
	start := time.Now()
	if opts.Threads < 0 || opts.ContextLength < 0 {
		return nil, fmt.Errorf("engine: Options.Threads %d, ContextLength %d: want >= 0 (0: the default)", opts.Threads, opts.ContextLength)
	}
	if err := opts.Batch.validate(); err != nil {
		return nil, err
	}
	if err := opts.Speculative.validate(); err != nil {
		return nil, err
	}
	if err := opts.GPU.Validate(); err != nil {
		return nil, fmt.Errorf("engine: Options.GPU: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("engine: model folder: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("engine: model path %s is not a folder", dir)
	}
	f, err := model.ReadFolderWith(dir, weights.OpenOptions{Copy: opts.CopyWeights})
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	cfg, gen := f.Config, f.Generation
	var tok *tokenizer.Tokenizer
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		if tok, err = tokenizer.Load(dir); err != nil {
			f.Close()
			return nil, fmt.Errorf("engine: %w", err)
		}
		if tok.VocabSize() > cfg.VocabSize {
			f.Close()
			return nil, fmt.Errorf("engine: %s: tokenizer.json has %d tokens but config.json's vocab_size is %d: they belong to different models",
				dir, tok.VocabSize(), cfg.VocabSize)
		}
	}
	b, net, note, err := build(opts, f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("engine: loading %s: %w", filepath.Base(dir), err)
	}
	ctxLen := opts.ContextLength
	if ctxLen <= 0 {
		ctxLen = cfg.MaxPositionEmbeddings
		if ctxLen <= 0 || ctxLen > DefaultContext {
			ctxLen = DefaultContext
		}
	}
	algo := ""
	if f.Quant != nil {
		algo = f.Quant.Algo
	}
	return &Model{dir: dir, cfg: cfg, gen: gen, folder: f, backend: b, caps: backend.CapabilitiesOf(b), net: net, tok: tok, ctxLen: ctxLen, deviceNote: note, sched: newScheduler(net, opts.Batch, b), specOpts: opts.Speculative,
		info: checkpointInfo(f.Checkpoint, algo), loadTime: time.Since(start), cacheBytesPerToken: sync.OnceValues(func() (int64, error) {
			st, err := net.NewState(1)
			if err != nil {
				return 0, err
			}
			return st.CacheBytesPerToken(), nil
		})}, nil
}

// build opens the device opts ask for and builds the model on it. "auto"
// takes the first GPU when a CUDA driver and a GPU are present and the model
// runs there, else the CPU; the returned note says why the GPU was passed over.
func build(opts Options, f *model.Folder) (backend.Backend, model.Model, string, error) {
	var note string
	gpu := func(ordinal int) (*kernels.Backend, error) { return kernels.New(ordinal, opts.GPU) }
	switch opts.Device {
	case "", "auto":
		if kernels.Available() {
			b, net, err := buildOn(gpu, opts, f)
			if err == nil {
				return b, net, "", nil
			}
			note = "GPU not used: " + err.Error()
		}
	case "cpu":
	case "cuda":
		b, net, err := buildOn(gpu, opts, f)
		if errors.Is(err, kernels.ErrNoDriver) {
			err = fmt.Errorf("device %q: %w: %v", opts.Device, ErrDevice, err)
		}
		return b, net, "", err
	default:
		return nil, nil, "", fmt.Errorf("device %q: %w: want auto, cpu or cuda", opts.Device, ErrDevice)
	}
	b, net, err := buildOn(func(int) (*cpu.Backend, error) { return cpu.New(opts.Threads), nil }, opts, f)
	return b, net, note, err
}

// buildOn opens a backend with open and builds the model on it.
func buildOn[B backend.Backend](open func(int) (B, error), opts Options, f *model.Folder) (backend.Backend, model.Model, error) {
	b, err := open(0)
	if err != nil {
		return nil, nil, err
	}
	place := opts.Experts
	if place.Host == nil {
		place.Host = cpu.New(opts.Threads)
	}
	if place.Context == 0 {
		place.Context = opts.ContextLength
	}
	net, err := model.Build(b, f, model.Options{Attention: opts.Attention, MTP: opts.Speculative.on(), Experts: place})
	if err != nil {
		b.Close()
		return nil, nil, err
	}
	return b, net, nil
}

// Config is the model's config.json.
func (m *Model) Config() *model.Config { return m.cfg }

// GenerationConfig is the model's generation_config.json (zero if absent).
func (m *Model) GenerationConfig() *model.GenerationConfig { return m.gen }

// Device describes the backend the model runs on, e.g. "cpu (16 threads)",
// and, when "auto" passed a GPU over, why.
func (m *Model) Device() string {
	if m.deviceNote != "" {
		return m.backend.Name() + "; " + m.deviceNote
	}
	return m.backend.Name()
}

// ExpertPlan is where the model's routed experts live (device or host
// memory) and the decode step's expected cost for it, as planned at Load;
// nil for models without a placement (all but DeepSeek-V4).
func (m *Model) ExpertPlan() *model.ExpertPlan {
	if p, ok := m.net.(model.ExpertPlanner); ok {
		return p.ExpertPlan()
	}
	return nil
}

// Backend is the compute backend the model runs on (a *cpu.Backend or a
// *kernels.Backend), for profiling and tools; most programs never need it.
func (m *Model) Backend() backend.Backend { return m.backend }

// BatchStats are the counts of the scheduler that batches concurrent
// sessions' steps (zero for a model that runs each session alone).
func (m *Model) BatchStats() BatchStats {
	if m.sched == nil {
		return BatchStats{}
	}
	return m.sched.Stats()
}

// LoadTime is how long Load took.
func (m *Model) LoadTime() time.Duration { return m.loadTime }

// ContextLength is the default number of positions of a new session.
func (m *Model) ContextLength() int { return m.ctxLen }

// Close closes the model. New sessions, and calls on existing sessions that
// run the model, fail afterwards with an error wrapping ErrClosed. Calls in
// flight are not interrupted mid-step: a generation stops at its next token
// (or prefill chunk) with ErrClosed. Close does not wait for them: when
// calls are in flight it returns nil at once and the last of them releases
// the weights' memory maps and the device as it returns (errors of that
// release are dropped); otherwise Close releases them itself and returns
// their error. Close may be called from any goroutine, a stream callback
// included, and more than once: calls after the first do nothing and
// return nil.
func (m *Model) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	idle := m.inflight == 0
	m.mu.Unlock()
	if idle {
		return m.release()
	}
	return nil
}

// release frees the device, then the weights' memory maps (work the device
// still has queued may read them); it is called once, by Close or by the
// last call in flight after it.
func (m *Model) release() error {
	err := errors.Join(m.backend.Close(), m.folder.Close())
	m.mu.Lock()
	m.freed = true
	m.mu.Unlock()
	return err
}

// released reports whether release has run (tests).
func (m *Model) released() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.freed
}

// acquire registers a call that uses the weights or the backend; it fails
// with ErrClosed after Close. Each successful acquire is paired with done.
func (m *Model) acquire() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("engine: %w", ErrClosed)
	}
	m.inflight++
	return nil
}

// done ends a call registered by acquire, releasing the model if it was
// closed meanwhile and this was the last call in flight.
func (m *Model) done() {
	m.mu.Lock()
	m.inflight--
	last := m.closed && m.inflight == 0
	m.mu.Unlock()
	if last {
		m.release()
	}
}

// closing returns an error wrapping ErrClosed once Close has been called:
// calls in flight check it between steps.
func (m *Model) closing() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("engine: %w", ErrClosed)
	}
	return nil
}

// EOSTokens are the model's end-of-sequence ids (generation_config.json,
// else config.json).
func (m *Model) EOSTokens() []int {
	if len(m.gen.EOSTokenIDs) > 0 {
		return m.gen.EOSTokenIDs
	}
	return m.cfg.EOSTokenIDs
}

// ErrNoTokenizer is returned by text methods of a model folder without tokenizer.json.
var ErrNoTokenizer = errors.New("model has no tokenizer.json")

// Tokenizer is the model's tokenizer, or nil when its folder has none.
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// Encode turns a prompt into token ids. With chat set, the text is the user's
// message, rendered through the model's chat template (with the generation
// prompt); otherwise it is encoded as is, with the special tokens the
// tokenizer adds and a BOS token when tokenizer_config.json asks for one.
func (m *Model) Encode(text string, chat bool) ([]int, error) {
	if m.tok == nil {
		return nil, fmt.Errorf("engine: %s: %w (pass token ids instead)", m.dir, ErrNoTokenizer)
	}
	if chat {
		return m.encodeChat([]Message{{Role: "user", Content: text}})
	}
	ids, err := m.tok.Encode(text, true)
	if err != nil {
		return nil, fmt.Errorf("engine: encode: %w", err)
	}
	if bos, ok := m.tok.BOS(); ok && m.tok.AddBOSToken() && (len(ids) == 0 || ids[0] != bos) {
		ids = append([]int{bos}, ids...)
	}
	return ids, nil
}

// Decode turns token ids into text, leaving out special tokens.
func (m *Model) Decode(ids []int) (string, error) {
	if m.tok == nil {
		return "", fmt.Errorf("engine: %s: %w", m.dir, ErrNoTokenizer)
	}
	text, err := m.tok.Decode(ids, true)
	if err != nil {
		return "", fmt.Errorf("engine: decode: %w", err)
	}
	return text, nil
}
