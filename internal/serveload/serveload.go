// Package serveload is a load-test client of cmd/serve's OpenAI API:
// streamed chat requests whose every token is checked in (one event a
// token, with its log-probability), and the latency percentiles of many.
// cmd/serve's load test and dev/serveload (the GPU load test) use it; the
// engine never does.
package serveload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Request is one streamed greedy request: a chat request with Prompt as the
// user's message, or with IDs set a completion request of those token ids
// (for a model folder without a tokenizer).
type Request struct {
	URL, Model, Prompt string
	IDs                []int
	MaxTokens          int
	// CancelAfter > 0: the client goes away after that many tokens.
	CancelAfter int
}

// Usage is a response's usage counts.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// Result is what the client saw of its request.
type Result struct {
	ID, Text, Finish string
	Tokens           int // events with a token's log-probability: one a token
	Usage            *Usage
	Done             bool // the stream ended with [DONE]
	TTFT             time.Duration
	Gaps             []time.Duration // between token events
	Err              error
}

// Complete reports whether the stream ended normally and its counts agree:
// [DONE], a finish reason, usage, one event a token.
func (r *Result) Complete() error {
	switch {
	case r.Err != nil:
		return r.Err
	case !r.Done || r.Finish == "" || r.Usage == nil:
		return fmt.Errorf("incomplete stream: [DONE] %v, finish_reason %q, usage %v", r.Done, r.Finish, r.Usage)
	case r.Tokens != r.Usage.CompletionTokens:
		return fmt.Errorf("%d token events, usage says %d tokens", r.Tokens, r.Usage.CompletionTokens)
	}
	return nil
}

// chunk is the part of a chat.completion.chunk the client reads.
type chunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		Text         string          `json:"text"`
		FinishReason *string         `json:"finish_reason"`
		LogProbs     json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
}

// StreamChat sends r and reads its stream to the end (or until
// r.CancelAfter tokens, when it goes away).
func StreamChat(ctx context.Context, client *http.Client, r Request) Result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fields := map[string]any{"model": r.Model, "stream": true, "temperature": 0, "max_tokens": r.MaxTokens,
		"stream_options": map[string]bool{"include_usage": true}}
	path := "/v1/chat/completions"
	if r.IDs != nil {
		path, fields["prompt"], fields["logprobs"] = "/v1/completions", r.IDs, 0
	} else {
		fields["messages"], fields["logprobs"] = []map[string]string{{"role": "user", "content": r.Prompt}}, true
	}
	body, _ := json.Marshal(fields)
	req, err := http.NewRequestWithContext(ctx, "POST", r.URL+path, bytes.NewReader(body))
	if err != nil {
		return Result{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Result{Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		return Result{Err: fmt.Errorf("status %d: %s", resp.StatusCode, msg)}
	}
	var res Result
	last := start
	res.Done, res.Err = Events(resp.Body, func(data string) {
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			res.Err = fmt.Errorf("event %q: %w", data, err)
			return
		}
		if res.ID == "" {
			res.ID = c.ID
		} else if c.ID != res.ID {
			res.Err = fmt.Errorf("an event of response %s in the stream of %s", c.ID, res.ID)
		}
		if c.Usage != nil {
			res.Usage = c.Usage
		}
		for _, ch := range c.Choices {
			res.Text += ch.Text
			if ch.Delta.Content != nil {
				res.Text += *ch.Delta.Content
			}
			if ch.FinishReason != nil {
				res.Finish = *ch.FinishReason
			}
			if len(ch.LogProbs) == 0 || string(ch.LogProbs) == "null" {
				continue
			}
			now := time.Now()
			if res.Tokens == 0 {
				res.TTFT = now.Sub(start)
			} else {
				res.Gaps = append(res.Gaps, now.Sub(last))
			}
			last = now
			res.Tokens++
			if res.Tokens == r.CancelAfter {
				cancel()
			}
		}
	})
	if res.Err != nil && ctx.Err() != nil && r.CancelAfter > 0 {
		res.Err = nil // the cancel asked for
	}
	return res
}

// Run calls client(i) for i in [0, n) from n goroutines at once and
// returns their results in order of i, and the wall time.
func Run[T any](n int, client func(i int) T) ([]T, time.Duration) {
	results := make([]T, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = client(i)
		}()
	}
	wg.Wait()
	return results, time.Since(start)
}

// Events reads server-sent events' data until [DONE] (done true) or the
// body's end, passing each to each as it arrives.
func Events(r io.Reader, each func(data string)) (done bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			if line != "" {
				return false, fmt.Errorf("not an event line: %q", line)
			}
			continue
		}
		if data == "[DONE]" {
			return true, nil
		}
		each(data)
	}
	return false, sc.Err()
}

// Summary are the latencies and rate of a set of results.
type Summary struct {
	Requests, Complete, Tokens int
	TTFT50, TTFT99             time.Duration
	ITL50, ITL99               time.Duration // inter-token latency
}

// Summarize summarizes the complete results.
func Summarize(results []Result) Summary {
	var s Summary
	var ttft, gaps []time.Duration
	for _, r := range results {
		s.Requests++
		if r.Complete() != nil {
			continue
		}
		s.Complete++
		s.Tokens += r.Tokens
		ttft = append(ttft, r.TTFT)
		gaps = append(gaps, r.Gaps...)
	}
	s.TTFT50, s.TTFT99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
	s.ITL50, s.ITL99 = percentile(gaps, 0.5), percentile(gaps, 0.99)
	return s
}

func (s Summary) String() string {
	return fmt.Sprintf("%d/%d requests complete, %d tokens; TTFT p50 %v p99 %v; inter-token p50 %v p99 %v",
		s.Complete, s.Requests, s.Tokens, s.TTFT50.Round(time.Microsecond), s.TTFT99.Round(time.Microsecond),
		s.ITL50.Round(time.Microsecond), s.ITL99.Round(time.Microsecond))
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}
