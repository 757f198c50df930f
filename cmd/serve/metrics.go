package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// metrics are serve's counters, written in Prometheus's text format by
// /metrics together with the scheduler's and the pool's.
type metrics struct {
	started      time.Time
	inflight     atomic.Int64
	tokens       atomic.Int64 // generated
	promptTokens atomic.Int64 // run (after prefix reuse)

	mu       sync.Mutex
	requests map[string]int64 // by outcome
	ttftSum  float64
	ttftN    int64
	rate     rateWindow
}

func newMetrics() *metrics {
	return &metrics{started: time.Now(), requests: map[string]int64{}}
}

// request counts a request's outcome.
func (m *metrics) request(err error) {
	outcome := "ok"
	var re *requestError
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		outcome = "cancelled"
	case errors.As(err, &re) && re.status < 500:
		outcome = "rejected"
	default:
		outcome = "error"
	}
	m.mu.Lock()
	m.requests[outcome]++
	m.mu.Unlock()
}

func (m *metrics) firstToken(d time.Duration) {
	m.mu.Lock()
	m.ttftSum += d.Seconds()
	m.ttftN++
	m.mu.Unlock()
}

// rateWindow is the tokens/s over the last seconds, from the generated
// count sampled at each scrape.
type rateWindow struct {
	at    time.Time
	count int64
	rate  float64
}

func (w *rateWindow) update(now time.Time, count int64) float64 {
	if dt := now.Sub(w.at).Seconds(); !w.at.IsZero() && dt > 0 {
		w.rate = float64(count-w.count) / dt
	}
	w.at, w.count = now, count
	return w.rate
}

func (s *server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	m := s.metrics
	var b strings.Builder
	metric := func(name, typ, help string, v any, labels ...string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		if len(labels) == 0 {
			fmt.Fprintf(&b, "%s %v\n", name, v)
		}
	}
	bs, ps := s.m.BatchStats(), s.pool.Stats()
	m.mu.Lock()
	rate := m.rate.update(time.Now(), m.tokens.Load())
	metric("manifold_requests_total", "counter", "Generation requests ended, by outcome.", nil, "outcome")
	for _, o := range []string{"ok", "rejected", "cancelled", "error"} {
		fmt.Fprintf(&b, "manifold_requests_total{outcome=%q} %d\n", o, m.requests[o])
	}
	ttftSum, ttftN := m.ttftSum, m.ttftN
	m.mu.Unlock()
	for _, g := range []struct {
		name, typ, help string
		v               any
	}{
		{"manifold_requests_in_flight", "gauge", "Generation requests being served.", m.inflight.Load()},
		{"manifold_queue_length", "gauge", "Requests waiting for a session.", ps.Waiting},
		{"manifold_sessions_busy", "gauge", "Sessions generating.", ps.Busy},
		{"manifold_sessions_max", "gauge", "The most sessions generating at once.", ps.Sessions},
		{"manifold_cache_bytes", "gauge", "KV cache memory of the sessions made.", ps.CacheBytes},
		{"manifold_prefix_reused_tokens_total", "counter", "Prompt tokens not run again thanks to prefix reuse.", ps.ReusedTokens},
		{"manifold_kv_blocks", "gauge", "Blocks of the paged KV cache (0: a cache a session).", ps.Blocks},
		{"manifold_kv_blocks_free", "gauge", "Blocks of the paged KV cache no session holds (cached ones included).", ps.FreeBlocks},
		{"manifold_kv_blocks_cached", "gauge", "Full blocks of the paged KV cache known by their prefix.", ps.CachedBlocks},
		{"manifold_kv_block_copies_total", "counter", "Blocks copied on write.", ps.Copies},
		{"manifold_batch_size", "gauge", "Sequences in the last batched step.", bs.LastBatch},
		{"manifold_batch_steps_total", "counter", "Batched forward steps run.", bs.Steps},
		{"manifold_batch_sequences_total", "counter", "Sequences summed over the batched steps.", bs.Sequences},
		{"manifold_batch_rows_total", "counter", "Tokens run by the batched steps.", bs.Rows},
		{"manifold_generated_tokens_total", "counter", "Tokens generated.", m.tokens.Load()},
		{"manifold_prompt_tokens_total", "counter", "Prompt tokens run.", m.promptTokens.Load()},
		{"manifold_tokens_per_second", "gauge", "Tokens generated a second since the previous scrape.", rate},
	} {
		metric(g.name, g.typ, g.help, g.v)
	}
	metric("manifold_time_to_first_token_seconds", "summary", "Time from a request's admission wait to its first token.", nil, "summary")
	fmt.Fprintf(&b, "manifold_time_to_first_token_seconds_sum %g\nmanifold_time_to_first_token_seconds_count %d\n", ttftSum, ttftN)
	metric("manifold_uptime_seconds", "gauge", "Seconds since the server started.", time.Since(m.started).Seconds())
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write([]byte(b.String()))
}
