package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/manifoldlm/manifold/internal/serveload"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"net/http"
	"strings"
	"testing"
)

// TestRequestValidation: bad requests get a 4xx with an OpenAI error body
// naming the field at fault.
func TestRequestValidation(t *testing.T) {
	ts := newTestServer(t, 2, 4)
	chat := `"model":"tiny","messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		path, body string
		status     int
		param      string
	}{
		{"/v1/chat/completions", `{`, 400, ""},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
		{"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"hi"}]}`, 404, "model"},
		{"/v1/chat/completions", `{"model":"tiny","messages":[]}`, 400, "messages"},
		{"/v1/chat/completions", `{"model":"tiny","messages":[{"role":"robot","content":"hi"}]}`, 400, "messages[0].role"},
		{"/v1/chat/completions", `{` + chat + `,"max_tokens":0}`, 400, "max_tokens"},
		{"/v1/chat/completions", `{` + chat + `,"temperature":3}`, 400, "temperature"},
		{"/v1/chat/completions", `{` + chat + `,"top_p":0}`, 400, "top_p"},
		{"/v1/chat/completions", `{` + chat + `,"n":2}`, 400, "n"},
		{"/v1/chat/completions", `{` + chat + `,"stop":["a","b","c","d","e"]}`, 400, "stop"},
		{"/v1/chat/completions", `{` + chat + `,"stop":[""]}`, 400, "stop"},
		{"/v1/chat/completions", `{` + chat + `,"top_logprobs":3}`, 400, "top_logprobs"},
		{"/v1/chat/completions", `{` + chat + `,"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs"},
		{"/v1/chat/completions", `{` + chat + `,"response_format":{"type":"json_schema"}}`, 400, "response_format.json_schema.schema"},
		{"/v1/chat/completions", `{` + chat + `,"response_format":{"type":"yaml"}}`, 400, "response_format"},
		{"/v1/chat/completions", `{` + chat + `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array"}}}}`, 400, "response_format"},
		{"/v1/chat/completions", `{` + chat + `,"max_tokens":"many"}`, 400, "max_tokens"},
		{"/v1/completions", `{"model":"tiny"}`, 400, "prompt"},
		{"/v1/completions", `{"model":"tiny","prompt":["a","b"]}`, 400, "prompt"},
		{"/v1/completions", `{"model":"tiny","prompt":[1,2,9999]}`, 400, "prompt"},
		{"/v1/completions", `{"model":"tiny","prompt":""}`, 400, "prompt"},
		{"/v1/completions", `{"model":"tiny","prompt":"a","logprobs":6}`, 400, "logprobs"},
		{"/v1/completions", `{"model":"tiny","prompt":"a","echo":true}`, 400, "echo"},
		{"/v1/completions", `{"model":"tiny","prompt":"` + strings.Repeat("a", 600) + `"}`, 400, "prompt"},
		{"/v1/embeddings", `{}`, 404, ""},
	} {
		status, body := ts.post(t, tc.path, tc.body)
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Message == "" {
			t.Errorf("%s %s: body %s is not an error object", tc.path, tc.body, body)
			continue
		}
		param := ""
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if status != tc.status || param != tc.param {
			t.Errorf("%s %.60s: %d param %q (%s), want %d param %q", tc.path, tc.body, status, param, e.Error.Message, tc.status, tc.param)
		}
	}
	resp, err := http.Post(ts.url+"/v1/completions", "text/plain", bytes.NewReader([]byte(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("text/plain body: %d, want 400", resp.StatusCode)
	}
}

// TestStreamMatchesWhole: a greedy request gives the same text, finish
// reason and usage streamed and not, over both endpoints; stop strings and
// max_tokens end it; logprobs come for every token.
func TestStreamMatchesWhole(t *testing.T) {
	ts := newTestServer(t, 2, 4)
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		finish     string
	}{
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Say hi"}}, "max_tokens": 12}, "length"},
		{"chat-logprobs", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Say hi"}}, "max_tokens": 7, "logprobs": true, "top_logprobs": 3}, "length"},
		{"completion", "/v1/completions", map[string]any{"prompt": "Once upon", "max_tokens": 10}, "length"},
		{"completion-ids", "/v1/completions", map[string]any{"prompt": []int{40, 41, 42}, "max_tokens": 5, "logprobs": 2}, "length"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.body["model"], tc.body["temperature"] = "tiny", 0
			status, whole := ts.post(t, tc.path, tc.body)
			if status != 200 {
				t.Fatalf("%d %s", status, whole)
			}
			var w struct {
				Choices []struct {
					Text         string
					FinishReason string `json:"finish_reason"`
					Message      struct{ Content string }
					LogProbs     json.RawMessage
				}
				Usage usage
			}
			if err := json.Unmarshal(whole, &w); err != nil {
				t.Fatal(err)
			}
			text := w.Choices[0].Text + w.Choices[0].Message.Content
			if w.Choices[0].FinishReason != tc.finish || w.Usage.CompletionTokens != tc.body["max_tokens"] || w.Usage.PromptTokens == 0 {
				t.Errorf("whole: finish %q, usage %+v", w.Choices[0].FinishReason, w.Usage)
			}
			if _, lp := tc.body["logprobs"]; lp == (string(w.Choices[0].LogProbs) == "null") {
				t.Errorf("logprobs %s", w.Choices[0].LogProbs)
			}
			tc.body["stream"], tc.body["stream_options"] = true, map[string]bool{"include_usage": true}
			data, _ := json.Marshal(tc.body)
			resp, err := http.Post(ts.url+tc.path, "application/json", bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			var streamed, finish string
			var u *usage
			logprobEvents := 0
			done, err := serveload.Events(resp.Body, func(data string) {
				var c struct {
					Choices []struct {
						Text         string
						Delta        struct{ Content string }
						FinishReason *string `json:"finish_reason"`
						LogProbs     json.RawMessage
					}
					Usage *usage
				}
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Errorf("event %s: %v", data, err)
				}
				for _, ch := range c.Choices {
					streamed += ch.Text + ch.Delta.Content
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
					if len(ch.LogProbs) > 0 && string(ch.LogProbs) != "null" {
						logprobEvents++
					}
				}
				if c.Usage != nil {
					u = c.Usage
				}
			})
			if err != nil || !done {
				t.Fatalf("stream ended without [DONE]: %v", err)
			}
			if streamed != text || finish != tc.finish || u == nil || *u != w.Usage {
				t.Errorf("streamed %q finish %q usage %+v; whole %q usage %+v", streamed, finish, u, text, w.Usage)
			}
			if _, lp := tc.body["logprobs"]; lp && logprobEvents != w.Usage.CompletionTokens {
				t.Errorf("%d events with logprobs for %d tokens", logprobEvents, w.Usage.CompletionTokens)
			}
			// A stop string taken from the text ends it before the string.
			if len(text) > 4 {
				stop := text[2:4]
				tc.body["stream"] = false
				tc.body["stop"] = stop
				_, body := ts.post(t, tc.path, tc.body)
				json.Unmarshal(body, &w)
				got := w.Choices[0].Text + w.Choices[0].Message.Content
				if want := text[:strings.Index(text, stop)]; got != want || w.Choices[0].FinishReason != "stop" {
					t.Errorf("stop %q: %q finish %q, want %q", stop, got, w.Choices[0].FinishReason, want)
				}
			}
		})
	}
}

// TestJSONObject: response_format json_object (and json_schema) gives a
// JSON object, or a prefix of one when max_tokens cuts it.
func TestJSONObject(t *testing.T) {
	ts := newTestServer(t, 2, 4)
	formats := []any{map[string]string{"type": "json_object"}, map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "p",
		"schema": map[string]any{"type": "object", "properties": map[string]any{"n": map[string]string{"type": "integer"}}}}}}
	for seed := range 4 {
		status, body := ts.post(t, "/v1/chat/completions", map[string]any{"model": "tiny", "seed": seed, "max_tokens": 300,
			"messages": []map[string]string{{"role": "user", "content": "JSON please"}}, "response_format": formats[seed%2]})
		var r struct {
			Choices []struct {
				Message      struct{ Content string }
				FinishReason string `json:"finish_reason"`
			}
		}
		if status != 200 || json.Unmarshal(body, &r) != nil {
			t.Fatalf("%d %s", status, body)
		}
		text := r.Choices[0].Message.Content
		if r.Choices[0].FinishReason == "stop" && !json.Valid([]byte(text)) || !strings.HasPrefix(strings.TrimSpace(text), "{") {
			t.Errorf("seed %d: %q, finish %q", seed, text, r.Choices[0].FinishReason)
		}
	}
}

// TestModelsHealthMetrics: the read-only endpoints.
func TestModelsHealthMetrics(t *testing.T) {
	ts := newTestServer(t, 2, 4)
	if status, body := ts.get(t, "/v1/models"); status != 200 || !strings.Contains(body, `"id":"tiny"`) || !strings.Contains(body, `"object":"list"`) {
		t.Errorf("/v1/models: %d %s", status, body)
	}
	if status, _ := ts.get(t, "/v1/models/tiny"); status != 200 {
		t.Errorf("/v1/models/tiny: %d", status)
	}
	if status, _ := ts.get(t, "/v1/models/other"); status != 404 {
		t.Errorf("/v1/models/other: %d", status)
	}
	if status, body := ts.get(t, "/health"); status != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/health: %d %s", status, body)
	}
	ts.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "abc", "max_tokens": 3, "temperature": 0})
	status, body := ts.get(t, "/metrics")
	for _, want := range []string{"manifold_queue_length 0", "manifold_batch_size ", "manifold_tokens_per_second ", "manifold_cache_bytes ",
		`manifold_requests_total{outcome="ok"} 1`, "manifold_generated_tokens_total 3", "# TYPE manifold_batch_steps_total counter"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics (%d) lacks %q:\n%s", status, want, body)
		}
	}
	ts.draining.Store(true)
	if status, _ := ts.get(t, "/health"); status != 503 {
		t.Errorf("/health while draining: %d", status)
	}
	if status, _ := ts.post(t, "/v1/completions", map[string]any{"model": "tiny", "prompt": "abc"}); status != 503 {
		t.Errorf("a request while draining: %d", status)
	}
}

// TestOpenAISDK drives the server with OpenAI's Go SDK: chat and text
// completions, whole and streamed (with usage and log-probabilities), the
// model list, and an error the SDK reads as an API error.
func TestOpenAISDK(t *testing.T) {
	ts := newTestServer(t, 4, 8)
	ctx := context.Background()
	client := openai.NewClient(option.WithBaseURL(ts.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))

	chat := openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Hello there")},
		MaxTokens:   openai.Int(9),
		Temperature: openai.Float(0),
		Logprobs:    openai.Bool(true),
		TopLogprobs: openai.Int(2),
	}
	whole, err := client.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Choices) != 1 || whole.Choices[0].FinishReason != "length" || whole.Usage.CompletionTokens != 9 ||
		len(whole.Choices[0].Logprobs.Content) != 9 || len(whole.Choices[0].Logprobs.Content[0].TopLogprobs) != 2 {
		t.Errorf("chat: %+v", whole)
	}
	chat.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, chat)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := acc.Choices[0].Message.Content, whole.Choices[0].Message.Content; got != want || acc.Usage.CompletionTokens != 9 {
		t.Errorf("streamed chat %q (usage %+v), whole %q", got, acc.Usage, want)
	}

	comp := openai.CompletionNewParams{
		Model:       "tiny",
		Prompt:      openai.CompletionNewParamsPromptUnion{OfString: openai.String("The quick brown")},
		MaxTokens:   openai.Int(6),
		Temperature: openai.Float(0),
		Seed:        openai.Int(3),
	}
	c, err := client.Completions.New(ctx, comp)
	if err != nil {
		t.Fatal(err)
	}
	cs := client.Completions.NewStreaming(ctx, comp)
	var text strings.Builder
	for cs.Next() {
		for _, ch := range cs.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != c.Choices[0].Text || c.Usage.CompletionTokens != 6 {
		t.Errorf("streamed completion %q, whole %q (usage %+v)", text.String(), c.Choices[0].Text, c.Usage)
	}

	models, err := client.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(models.Data) != 1 || models.Data[0].ID != "tiny" {
		t.Errorf("models %+v", models.Data)
	}

	chat.Model = "gpt-unknown"
	_, err = client.Chat.Completions.New(ctx, chat)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %v", err)
	}
}
