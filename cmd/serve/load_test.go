package main

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/serveload"
)

// TestLoad runs concurrent streaming clients against the server, more than
// it has sessions: every request is answered once and completely, with the
// tokens it gives alone; the clients that go away have their requests
// cancelled; sessions, cache and heap stay bounded. It logs the p50/p99 time
// to first token and inter-token latency.
func TestLoad(t *testing.T) {
	const clients, sessions = 24, 8
	ts := newTestServer(t, sessions, 2*clients)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	request := func(i int) serveload.Request {
		r := serveload.Request{URL: ts.url, Model: "tiny", MaxTokens: 8 + i%17,
			Prompt: fmt.Sprintf("Request %d: %s", i, strings.Repeat("tell me more. ", i%5))}
		if cancelled(i) { // long, so that it is cancelled before its end (else counted as finished)
			r.CancelAfter, r.MaxTokens = 3, 400
		}
		return r
	}
	results, elapsed := serveload.Run(clients, func(i int) serveload.Result {
		return serveload.StreamChat(context.Background(), http.DefaultClient, request(i))
	})
	deadline := time.Now().Add(5 * time.Second)
	for ts.metrics.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := ts.metrics.inflight.Load(); n != 0 {
		t.Errorf("%d requests still in flight", n)
	}
	var wantCancelled int64
	for i, r := range results {
		if cancelled(i) && !r.Done {
			wantCancelled++
		}
	}
	ts.metrics.mu.Lock()
	nCancelled := ts.metrics.requests["cancelled"]
	ts.metrics.mu.Unlock()
	if nCancelled != wantCancelled || wantCancelled == 0 {
		t.Errorf("%d requests cancelled, want %d (of %d clients that went away)", nCancelled, wantCancelled, clients/6)
	}
	ids := map[string]bool{}
	var complete []serveload.Result
	for i, r := range results {
		if cancelled(i) {
			if r.Err != nil {
				t.Errorf("client %d went away: %v", i, r.Err)
			}
			continue
		}
		if err := r.Complete(); err != nil {
			t.Errorf("client %d: %v", i, err)
			continue
		}
		if ids[r.ID] {
			t.Errorf("client %d: response id %s seen twice", i, r.ID)
		}
		ids[r.ID] = true
		if (r.Finish == "length") != (r.Tokens == request(i).MaxTokens) {
			t.Errorf("client %d: %d tokens, finish %q, max_tokens %d", i, r.Tokens, r.Finish, request(i).MaxTokens)
		}
		alone := serveload.StreamChat(context.Background(), http.DefaultClient, request(i))
		if alone.Text != r.Text || alone.Tokens != r.Tokens {
			t.Errorf("client %d: %q (%d tokens) under load, %q (%d) alone", i, r.Text, r.Tokens, alone.Text, alone.Tokens)
		}
		complete = append(complete, r)
	}
	ps, bs := ts.pool.Stats(), ts.m.BatchStats()
	if ps.Busy != 0 || ps.Waiting != 0 || bs.Active != 0 || bs.Queued != 0 || ps.Sessions != sessions {
		t.Errorf("left behind: pool %+v, scheduler %+v", ps, bs)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 64<<20 {
		t.Errorf("heap grew by %d MiB", grew>>20)
	}
	sum := serveload.Summarize(complete)
	t.Logf("%d clients, %d sessions, %v (%.0f tok/s), mean batch %.1f: %v", clients, sessions, elapsed.Round(time.Millisecond),
		float64(sum.Tokens)/elapsed.Seconds(), float64(bs.Sequences)/float64(max(1, bs.Steps)), sum)
}

// cancelled reports whether client i goes away mid-stream.
func cancelled(i int) bool { return i%6 == 5 }
