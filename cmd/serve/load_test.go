package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// loadResult is what a streaming client saw of its request.
type loadResult struct {
	id, text, finish string
	tokens           int // events with a token's log-probability: one a token
	usage            *usage
	done             bool
	ttft             time.Duration
	gaps             []time.Duration // between token events
	err              error
}

// streamChat sends a streamed greedy chat request and reads it to its end,
// or until cancelAfter token events (then it goes away).
func streamChat(ctx context.Context, url, prompt string, maxTokens, cancelAfter int) loadResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"model": "tiny", "stream": true, "temperature": 0, "max_tokens": maxTokens, "logprobs": true,
		"stream_options": map[string]bool{"include_usage": true}, "messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return loadResult{err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return loadResult{err: fmt.Errorf("status %d", resp.StatusCode)}
	}
	var r loadResult
	last := start
	r.done, r.err = events(resp.Body, func(data string) {
		var c chatResponse
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			r.err = err
			return
		}
		if r.id == "" {
			r.id = c.ID
		} else if r.id != c.ID {
			r.err = fmt.Errorf("event of response %s in the stream of %s", c.ID, r.id)
		}
		r.usage = cmpOr(c.Usage, r.usage)
		for _, ch := range c.Choices {
			if ch.Delta != nil && ch.Delta.Content != nil {
				r.text += *ch.Delta.Content
			}
			if ch.FinishReason != nil {
				r.finish = *ch.FinishReason
			}
			if ch.LogProbs != nil {
				now := time.Now()
				if r.tokens == 0 {
					r.ttft = now.Sub(start)
				} else {
					r.gaps = append(r.gaps, now.Sub(last))
				}
				last = now
				r.tokens++
				if r.tokens == cancelAfter {
					cancel()
				}
			}
		}
	})
	return r
}

func cmpOr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

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
	prompt := func(i int) string { return fmt.Sprintf("Request %d: %s", i, strings.Repeat("tell me more. ", i%5)) }
	maxTokens := func(i int) int { return 8 + i%17 }
	cancelled := func(i int) bool { return i%6 == 5 }
	results := make([]loadResult, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			after := 0
			if cancelled(i) {
				after = 3
			}
			results[i] = streamChat(context.Background(), ts.url, prompt(i), maxTokens(i), after)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	deadline := time.Now().Add(5 * time.Second)
	for ts.metrics.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if ts.metrics.inflight.Load() != 0 {
		t.Errorf("%d requests still in flight", ts.metrics.inflight.Load())
	}
	ts.metrics.mu.Lock()
	nCancelled := ts.metrics.requests["cancelled"]
	ts.metrics.mu.Unlock()
	if want := int64(clients / 6); nCancelled != want {
		t.Errorf("%d requests cancelled, want %d", nCancelled, want)
	}
	ids := map[string]bool{}
	var ttft, gaps []time.Duration
	tokens := 0
	for i, r := range results {
		if cancelled(i) {
			if r.done {
				t.Errorf("client %d went away, but its stream ended with [DONE]", i)
			}
			continue
		}
		if r.err != nil || !r.done || r.usage == nil || r.finish == "" {
			t.Errorf("client %d: incomplete: err %v, done %v, finish %q, usage %v", i, r.err, r.done, r.finish, r.usage)
			continue
		}
		if ids[r.id] {
			t.Errorf("client %d: response id %s seen twice", i, r.id)
		}
		ids[r.id] = true
		if r.tokens != r.usage.CompletionTokens || (r.finish == "length") != (r.tokens == maxTokens(i)) {
			t.Errorf("client %d: %d token events, usage %+v, finish %q, max_tokens %d", i, r.tokens, r.usage, r.finish, maxTokens(i))
		}
		alone := streamChat(context.Background(), ts.url, prompt(i), maxTokens(i), 0)
		if alone.text != r.text || alone.tokens != r.tokens {
			t.Errorf("client %d: %q (%d tokens) under load, %q (%d) alone", i, r.text, r.tokens, alone.text, alone.tokens)
		}
		ttft = append(ttft, r.ttft)
		gaps = append(gaps, r.gaps...)
		tokens += r.tokens
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
	t.Logf("%d clients (%d sessions): %d tokens in %v (%.0f tok/s), mean batch %.1f; TTFT p50 %v p99 %v; inter-token p50 %v p99 %v",
		clients, sessions, tokens, elapsed.Round(time.Millisecond), float64(tokens)/elapsed.Seconds(), float64(bs.Sequences)/float64(max(1, bs.Steps)),
		percentile(ttft, 0.5), percentile(ttft, 0.99), percentile(gaps, 0.5), percentile(gaps, 0.99))
}
