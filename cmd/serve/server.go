package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/manifoldlm/manifold/engine"
)

// maxBodyBytes bounds a request's body.
const maxBodyBytes = 8 << 20

// server serves one model over the OpenAI API.
type server struct {
	m       *engine.Model
	pool    *engine.Pool
	name    string // the model's id in the API
	created int64
	// base ends every generation when cancelled (shutdown past its grace).
	base     context.Context
	draining atomic.Bool
	inflight sync.WaitGroup
	metrics  *metrics
	// defaultMaxTokens is max_tokens of a request that gives none (0: until
	// a stop or the context's end).
	defaultMaxTokens int
	nextID           atomic.Int64
}

func newServer(base context.Context, m *engine.Model, pool *engine.Pool, name string) *server {
	return &server{m: m, pool: pool, name: name, created: time.Now().Unix(), base: base, metrics: newMetrics()}
}

// handler routes the API.
func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.counted(s.chat))
	mux.HandleFunc("POST /v1/completions", s.counted(s.completions))
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /v1/models/{id}", s.models)
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &requestError{status: 404, typ: "invalid_request_error", code: "not_found",
			message: fmt.Sprintf("no route %s %s: serve has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics", r.Method, r.URL.Path)})
	})
	return mux
}

// counted wraps a generation endpoint: it refuses requests while draining,
// counts the request in flight and its outcome.
func (s *server) counted(h func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			writeError(w, &requestError{status: 503, typ: "server_error", code: "shutting_down", message: "the server is shutting down"})
			return
		}
		s.inflight.Add(1)
		defer s.inflight.Done()
		s.metrics.inflight.Add(1)
		defer s.metrics.inflight.Add(-1)
		err := h(w, r)
		s.metrics.request(err)
		if err != nil && !errors.Is(err, errStreamed) {
			writeError(w, err)
		}
	}
}

// errStreamed wraps an error met after a stream's headers went out: it is
// reported in the stream, not as a status.
var errStreamed = errors.New("streamed")

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError writes err as an OpenAI error body: a requestError with its
// status, a full queue as 429, a closed pool as 503, a cancelled request as
// 499 (nobody reads it), anything else as 500.
func writeError(w http.ResponseWriter, err error) {
	var re *requestError
	switch {
	case errors.As(err, &re):
	case errors.Is(err, engine.ErrQueueFull):
		re = &requestError{status: 429, typ: "rate_limit_error", code: "queue_full", message: err.Error()}
	case errors.Is(err, engine.ErrPoolClosed), errors.Is(err, engine.ErrClosed):
		re = &requestError{status: 503, typ: "server_error", code: "shutting_down", message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		re = &requestError{status: 499, typ: "server_error", code: "cancelled", message: err.Error()}
	case errors.Is(err, engine.ErrContextFull):
		re = &requestError{status: 400, typ: "invalid_request_error", code: "context_length_exceeded", message: err.Error()}
	default:
		re = &requestError{status: 500, typ: "server_error", message: err.Error()}
	}
	body := apiErrorBody{Message: re.message, Type: re.typ}
	if re.param != "" {
		body.Param = &re.param
	}
	if re.code != "" {
		body.Code = &re.code
	}
	writeJSON(w, re.status, apiError{body})
}

// decode reads a JSON body into v, refusing unknown trouble with a 400.
func decode(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return badRequest("", "Content-Type is %q: want application/json", ct)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return badRequest("", "reading the body: %v", err)
	}
	if len(body) > maxBodyBytes {
		return &requestError{status: 413, typ: "invalid_request_error", message: fmt.Sprintf("the body is over %d bytes", maxBodyBytes)}
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := te.Field[strings.LastIndex(te.Field, ".")+1:] // the JSON name, not the embedding's path
			return badRequest(field, "field %s: want a JSON %s, got %s", field, te.Type, te.Value)
		}
		return badRequest("", "the body is not valid JSON for this endpoint: %v", err)
	}
	return nil
}

// checkModel refuses a model other than the one served.
func (s *server) checkModel(name string) error {
	if name == "" {
		return badRequest("model", "model is missing: this server serves %q", s.name)
	}
	if name != s.name {
		return &requestError{status: 404, param: "model", code: "model_not_found", typ: "invalid_request_error",
			message: fmt.Sprintf("model %q not found: this server serves %q", name, s.name)}
	}
	return nil
}

func (s *server) models(w http.ResponseWriter, r *http.Request) {
	mo := modelObject{ID: s.name, Object: "model", Created: s.created, OwnedBy: "manifold"}
	if id := r.PathValue("id"); id != "" {
		if err := s.checkModel(id); err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, mo)
		return
	}
	writeJSON(w, 200, modelList{Object: "list", Data: []modelObject{mo}})
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, 503, map[string]string{"status": "shutting down"})
		return
	}
	writeJSON(w, 200, map[string]string{"status": "ok", "model": s.name})
}

// job is one generation: its prompt, options, and what the endpoint does
// with each token and with the end.
type job struct {
	prompt []int
	opts   engine.GenerateOptions
	param  string // the request's field that holds the prompt
}

// run generates j in a session of the pool, calling each with every token;
// the result's PromptTokens is the whole prompt's (prefix reuse included).
// The request's context, and the server's base, cancel it.
func (s *server) run(ctx context.Context, j job, each func(engine.Token) error) (*engine.Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()
	if free := s.pool.Options().ContextLength - len(j.prompt); free < 1 {
		return nil, &requestError{status: 400, typ: "invalid_request_error", code: "context_length_exceeded", param: j.param,
			message: fmt.Sprintf("the prompt has %d tokens: the context holds %d positions, and one is needed for the reply", len(j.prompt), s.pool.Options().ContextLength)}
	}
	start := time.Now()
	sess, n, err := s.pool.Acquire(ctx, j.prompt)
	if err != nil {
		return nil, err
	}
	defer s.pool.Release(sess)
	first := true
	res, err := sess.Generate(ctx, j.prompt[n:], j.opts, func(t engine.Token) error {
		if first {
			s.metrics.firstToken(time.Since(start))
			first = false
		}
		s.metrics.tokens.Add(1)
		return each(t)
	})
	s.metrics.promptTokens.Add(int64(len(j.prompt) - n))
	if res != nil {
		res.PromptTokens = len(j.prompt)
	}
	return res, err
}

// randomSeed seeds a request that gives none.
func randomSeed() uint64 { return rand.Uint64() }

// id makes a response id.
func (s *server) id(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, s.created, s.nextID.Add(1))
}

// sse writes server-sent events.
type sse struct {
	w       http.ResponseWriter
	flusher http.Flusher
	started bool
}

func newSSE(w http.ResponseWriter) *sse {
	f, _ := w.(http.Flusher)
	return &sse{w: w, flusher: f}
}

// send writes one event with v as JSON (or the raw [DONE]).
func (e *sse) send(v any) error {
	if !e.started {
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		e.w.WriteHeader(200)
		e.started = true
	}
	var data []byte
	if s, ok := v.(string); ok {
		data = []byte(s)
	} else {
		var err error
		if data, err = json.Marshal(v); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(e.w, "data: %s\n\n", data); err != nil {
		return err
	}
	if e.flusher != nil {
		e.flusher.Flush()
	}
	return nil
}

// fail ends a stream whose generation failed: before anything was sent the
// error is the response; after, an error event (then the stream ends).
func (e *sse) fail(err error) error {
	if !e.started {
		return err
	}
	var re *requestError
	msg, typ := err.Error(), "server_error"
	if errors.As(err, &re) {
		typ = re.typ
	}
	e.send(apiError{apiErrorBody{Message: msg, Type: typ}})
	return fmt.Errorf("%w: %w", errStreamed, err)
}

// tokenText is the text of token id alone, for log-probabilities.
func (s *server) tokenText(id int) string {
	if tok := s.m.Tokenizer(); tok != nil {
		if t, err := tok.Decode([]int{id}, false); err == nil {
			return t
		}
	}
	return fmt.Sprintf("<%d>", id)
}

func byteValues(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}
