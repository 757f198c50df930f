package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/manifoldlm/manifold/engine"
)

// This file holds the OpenAI API's request and response bodies, the subset
// serve implements, and the checks of a request that give a 400 naming the
// field.

// apiError is the body of every error response.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// requestError is a request the server refuses: status, the field at
// fault (or ""), a code (or "") and a message.
type requestError struct {
	status       int
	param, code  string
	message, typ string
}

func (e *requestError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *requestError {
	return &requestError{status: 400, param: param, typ: "invalid_request_error", message: fmt.Sprintf(format, args...)}
}

// stringList is a JSON string or array of strings ("stop", "prompt").
type stringList []string

func (s *stringList) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	var one string
	if json.Unmarshal(b, &one) == nil {
		*s = stringList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("want a string or an array of strings")
	}
	*s = many
	return nil
}

// promptInput is a completion's prompt: a string, an array of one string,
// or token ids (an array of integers, or an array of one such array).
type promptInput struct {
	text string
	ids  []int
	n    int // prompts given (serve runs one)
}

func (p *promptInput) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		p.text, p.n = s, 1
		return nil
	}
	var ss []string
	if json.Unmarshal(b, &ss) == nil {
		p.n = len(ss)
		if len(ss) > 0 {
			p.text = ss[0]
		}
		return nil
	}
	var ids []int
	if json.Unmarshal(b, &ids) == nil {
		p.ids, p.n = ids, 1
		return nil
	}
	var idss [][]int
	if json.Unmarshal(b, &idss) == nil {
		p.n = len(idss)
		if len(idss) > 0 {
			p.ids = idss[0]
		}
		return nil
	}
	return errors.New("want a string, an array of strings, or token ids")
}

// messageContent is a chat message's content: a string, or an array of
// parts of which serve reads the text ones.
type messageContent string

func (c *messageContent) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = messageContent(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("want a string or an array of content parts")
	}
	var all string
	for _, p := range parts {
		if p.Type != "text" {
			return fmt.Errorf("content part of type %q: only text parts are supported", p.Type)
		}
		all += p.Text
	}
	*c = messageContent(all)
	return nil
}

type chatMessage struct {
	Role    string         `json:"role"`
	Content messageContent `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// samplingFields are the fields chat and completion requests share.
type samplingFields struct {
	Model string `json:"model"`
	// How much: max_tokens, the stop strings, the number of choices (1).
	MaxTokens *int       `json:"max_tokens"`
	Stop      stringList `json:"stop"`
	N         *int       `json:"n"`
	drawFields
	// Server-sent events instead of one body.
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
}

// drawFields are how each token is drawn.
type drawFields struct {
	Temperature *float64 `json:"temperature"`
	TopP        *float64 `json:"top_p"`
	Seed        *int64   `json:"seed"`
}

func (f *samplingFields) model() string { return f.Model }

type chatRequest struct {
	samplingFields
	Messages            []chatMessage `json:"messages"`
	MaxCompletionTokens *int          `json:"max_completion_tokens"`
	LogProbs            bool          `json:"logprobs"`
	TopLogProbs         *int          `json:"top_logprobs"`
	ResponseFormat      *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
}

type completionRequest struct {
	samplingFields
	Prompt   *promptInput `json:"prompt"`
	LogProbs *int         `json:"logprobs"`
	Echo     bool         `json:"echo"`
}

// maxStops is the most stop strings a request may give (as OpenAI's API).
const maxStops = 4

// options checks the shared fields and turns them into generation
// options; defaultMax is the max_tokens when the request gives none (0:
// until a stop or the context's end).
func (f *samplingFields) options(defaultMax int, seed func() uint64) (engine.GenerateOptions, error) {
	var o engine.GenerateOptions
	if f.N != nil && *f.N != 1 {
		return o, badRequest("n", "n is %d: only n=1 is supported", *f.N)
	}
	o.MaxTokens = defaultMax
	if f.MaxTokens != nil {
		if *f.MaxTokens < 1 {
			return o, badRequest("max_tokens", "max_tokens is %d: want at least 1", *f.MaxTokens)
		}
		o.MaxTokens = *f.MaxTokens
	}
	o.Sampling.Temperature = 1
	if f.Temperature != nil {
		if t := *f.Temperature; !(t >= 0 && t <= 2) {
			return o, badRequest("temperature", "temperature is %v: want a number in [0, 2]", t)
		}
		o.Sampling.Temperature = *f.Temperature
	}
	if f.TopP != nil {
		if p := *f.TopP; !(p > 0 && p <= 1) {
			return o, badRequest("top_p", "top_p is %v: want a number in (0, 1]", p)
		}
		o.Sampling.TopP = *f.TopP
	}
	if f.Seed != nil {
		o.Sampling.Seed = uint64(*f.Seed)
	} else {
		o.Sampling.Seed = seed()
	}
	if len(f.Stop) > maxStops {
		return o, badRequest("stop", "stop has %d strings: at most %d", len(f.Stop), maxStops)
	}
	for i, s := range f.Stop {
		if s == "" {
			return o, badRequest("stop", "stop[%d] is empty", i)
		}
	}
	o.StopStrings = f.Stop
	return o, nil
}

// usage counts a request's tokens.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newUsage(prompt, completion int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
}

// Chat responses.

type chatLogProb struct {
	Token       string        `json:"token"`
	LogProb     float64       `json:"logprob"`
	Bytes       []int         `json:"bytes"`
	TopLogProbs []chatLogProb `json:"top_logprobs"`
}

type chatLogProbs struct {
	Content []chatLogProb `json:"content"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      *chatMessageO `json:"message,omitempty"`
	Delta        *chatMessageO `json:"delta,omitempty"`
	LogProbs     *chatLogProbs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

// chatMessageO is a message of a response (content may be absent in a delta).
type chatMessageO struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// response is a chat or completion response, or a chunk of its stream.
type response[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

type chatResponse = response[chatChoice]

// Completion responses.

type completionLogProbs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogProbs []float64            `json:"token_logprobs"`
	TopLogProbs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	LogProbs     *completionLogProbs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

type completionResponse = response[completionChoice]

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

// finishReason is OpenAI's name for why generation stopped.
func finishReason(r engine.StopReason) *string {
	s := "stop"
	if r == engine.StopMaxTokens || r == engine.StopContext {
		s = "length"
	}
	return &s
}

// logProb is a log-probability as JSON can hold it (-Inf as a large
// negative number).
func logProb(v float32) float64 {
	if math.IsInf(float64(v), -1) {
		return -9999
	}
	return float64(v)
}
