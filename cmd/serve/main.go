// Command serve serves a model over the OpenAI API.
//
//	go run ./cmd/serve -model DIR [-addr 127.0.0.1:8080] [-name ID] [-sessions N] [-ctx N] ...
//
// Endpoints: POST /v1/chat/completions and POST /v1/completions (streamed
// as server-sent events with "stream": true), GET /v1/models, GET /health,
// GET /metrics (Prometheus text format). Requests that generate at once are
// batched (continuous batching, engine.BatchOptions) for the architectures
// that batch (Llama, Qwen3); the others run each request alone. At most
// -sessions requests generate at once, each in a session of -ctx positions
// whose tokens stay for later requests that share their prefix; up to
// -queue more wait (first come, first served), and the rest get 429.
//
// A client that goes away cancels its request. SIGINT or SIGTERM starts a
// graceful shutdown: new requests get 503, those in flight finish, and
// after -shutdown-grace the rest are cancelled.
//
// Without -model it serves the built-in model (a small DeepSeek-V4).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/defaultmodel"
)

type options struct {
	model, name, addr, device string
	threads, ctx              int
	sessions, queue           int
	maxBatch, stepTokens      int
	maxTokens                 int
	blockSize, blocks         int
	noBatch                   bool
	grace                     time.Duration
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, f := range []struct {
		p         *string
		name, def string
		usage     string
	}{
		{&o.model, "model", "", "model folder (default: the built-in model)"},
		{&o.name, "name", "", "the model's id in the API (default: the folder's name)"},
		{&o.addr, "addr", "127.0.0.1:8080", "address to listen on"},
		{&o.device, "device", "auto", "auto, cpu or cuda"},
	} {
		fs.StringVar(f.p, f.name, f.def, f.usage)
	}
	for _, f := range []struct {
		p     *int
		name  string
		def   int
		usage string
	}{
		{&o.threads, "threads", 0, "CPU threads (0: one per core)"},
		{&o.ctx, "ctx", 0, "positions of each session (0: the model's context, at most 4096)"},
		{&o.sessions, "sessions", 16, "the most requests generating at once (lowered to fit the CPU's memory)"},
		{&o.queue, "queue", 0, "the most requests waiting for a session (0: 4 x sessions; -1: none)"},
		{&o.maxBatch, "max-batch", 0, "the most sequences of one batched step (0: 64)"},
		{&o.stepTokens, "step-tokens", 0, "the most tokens of one batched step, prompt chunks included (0: 512)"},
		{&o.maxTokens, "max-tokens", 0, "max_tokens of a chat request that gives none (0: until a stop or the context's end)"},
		{&o.blockSize, "block-size", 0, "positions of a block of the paged KV cache the sessions share, where the backend pages it (0: 16; -1: a cache a session)"},
		{&o.blocks, "blocks", 0, "blocks of the paged KV cache (0: the memory of -sessions caches of -ctx positions)"},
	} {
		fs.IntVar(f.p, f.name, f.def, f.usage)
	}
	fs.BoolVar(&o.noBatch, "no-batch", false, "run each request alone (no batching)")
	fs.DurationVar(&o.grace, "shutdown-grace", 30*time.Second, "how long a shutdown waits for requests in flight before cancelling them")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	if o.threads < 0 || o.ctx < 0 || o.sessions < 1 || o.maxBatch < 0 || o.stepTokens < 0 || o.maxTokens < 0 || o.queue < -1 || o.blockSize < -1 || o.blocks < 0 {
		return nil, fmt.Errorf("serve: -threads, -ctx, -max-batch, -step-tokens, -max-tokens, -blocks must be >= 0, -sessions >= 1, -queue and -block-size >= -1")
	}
	return o, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run serves until ctx ends, then shuts down gracefully. ready, if not nil,
// is called with the listening address once requests are accepted.
func run(ctx context.Context, args []string, logw io.Writer, ready func(addr string)) error {
	o, err := parseFlags(args, logw)
	if err != nil {
		return err
	}
	if o.model == "" {
		if o.model, err = defaultmodel.Dir(); err != nil {
			return fmt.Errorf("serve: built-in model: %w", err)
		}
		if o.name == "" {
			o.name = "manifold-builtin"
		}
	}
	if o.name == "" {
		o.name = filepath.Base(filepath.Clean(o.model))
	}
	m, err := engine.Load(o.model, engine.Options{Device: o.device, Threads: o.threads, ContextLength: o.ctx,
		Batch: engine.BatchOptions{Off: o.noBatch, MaxSequences: o.maxBatch, StepTokens: o.stepTokens}})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer m.Close()
	pool, err := m.NewPool(engine.PoolOptions{Sessions: o.sessions, ContextLength: o.ctx, MaxQueue: o.queue,
		BlockSize: max(o.blockSize, 0), Blocks: o.blocks, Unpaged: o.blockSize < 0})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newServer(base, m, pool, o.name)
	s.defaultMaxTokens = o.maxTokens
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	po := pool.Options()
	fmt.Fprintf(logw, "serve: %s (%s) on http://%s: %d sessions of %d positions, queue %d, loaded in %v\n",
		o.name, m.Device(), ln.Addr(), po.Sessions, po.ContextLength, po.MaxQueue, m.LoadTime().Round(time.Millisecond))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	return shutdown(s, srv, pool, o.grace, cancel, logw)
}

// shutdown refuses new requests, waits up to grace for those in flight,
// then cancels the rest and closes the server.
func shutdown(s *server, srv *http.Server, pool *engine.Pool, grace time.Duration, cancel context.CancelFunc, logw io.Writer) error {
	fmt.Fprintf(logw, "serve: shutting down: %d requests in flight\n", s.metrics.inflight.Load())
	s.draining.Store(true)
	pool.Close() // requests waiting for a session end now
	gctx, gcancel := context.WithTimeout(context.Background(), grace)
	defer gcancel()
	err := srv.Shutdown(gctx)
	if err != nil { // past the grace: cancel the generations, then wait for their handlers
		fmt.Fprintf(logw, "serve: cancelling %d requests after %v\n", s.metrics.inflight.Load(), grace)
		cancel()
		s.inflight.Wait()
		srv.Close()
	}
	s.inflight.Wait()
	return nil
}
