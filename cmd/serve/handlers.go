package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/manifoldlm/manifold/engine"
)

// shape is what makes a generation a chat or a completion response: the
// events of a stream and the body of a whole response.
type shape interface {
	start() any                                        // a stream's first event (nil: none)
	token(t engine.Token) any                          // a token's event (nil: none)
	end(res *engine.Result) any                        // the event with finish_reason
	usage(u *usage) any                                // the usage event (stream_options.include_usage)
	whole(res *engine.Result, toks []engine.Token) any // the body of a response not streamed
}

// respond runs j and writes the response sh makes of it: server-sent
// events when stream is set, else one JSON body.
func (s *server) respond(w http.ResponseWriter, r *http.Request, j job, stream, includeUsage bool, sh shape) error {
	if !stream {
		var toks []engine.Token
		res, err := s.run(r.Context(), j, func(t engine.Token) error {
			toks = append(toks, t)
			return nil
		})
		if err != nil {
			return err
		}
		writeJSON(w, 200, sh.whole(res, toks))
		return nil
	}
	ev := newSSE(w)
	begin := func() error {
		if st := sh.start(); st != nil && !ev.started {
			return ev.send(st)
		}
		return nil
	}
	res, err := s.run(r.Context(), j, func(t engine.Token) error {
		if err := begin(); err != nil {
			return err
		}
		if c := sh.token(t); c != nil {
			return ev.send(c)
		}
		return nil
	})
	if err != nil {
		return ev.fail(err)
	}
	if err := errors.Join(begin(), ev.send(sh.end(res))); err != nil {
		return ev.fail(err)
	}
	if includeUsage {
		ev.send(sh.usage(newUsage(res.PromptTokens, len(res.Tokens))))
	}
	ev.send("[DONE]")
	return nil
}

// parse decodes a generation request's body into req and checks its model.
func (s *server) parse(r *http.Request, req interface{ model() string }) error {
	if err := decode(r, req); err != nil {
		return err
	}
	return s.checkModel(req.model())
}

// chatRoles are the roles a chat message may have.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

func (s *server) chat(w http.ResponseWriter, r *http.Request) error {
	var req chatRequest
	if err := s.parse(r, &req); err != nil {
		return err
	}
	if len(req.Messages) == 0 {
		return badRequest("messages", "messages is empty: want at least one message")
	}
	msgs := make([]engine.Message, len(req.Messages))
	for i, m := range req.Messages {
		if !chatRoles[m.Role] {
			return badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d].role is %q: want system, developer, user, assistant or tool", i, m.Role)
		}
		msgs[i] = engine.Message{Role: m.Role, Content: string(m.Content)}
	}
	var format func() (engine.Constraint, error) // the constraint of response_format
	if rf := req.ResponseFormat; rf != nil {
		switch rf.Type {
		case "text":
		case "json_object":
			format = func() (engine.Constraint, error) { return s.m.NewJSONConstraint(nil) }
		case "json_schema":
			if rf.JSONSchema == nil || len(rf.JSONSchema.Schema) == 0 {
				return badRequest("response_format.json_schema.schema", "response_format json_schema needs json_schema.schema")
			}
			format = func() (engine.Constraint, error) { return s.m.NewJSONSchemaConstraint(rf.JSONSchema.Schema, nil) }
		default:
			return badRequest("response_format", "response_format %q is not supported (text, json_object or json_schema)", rf.Type)
		}
	}
	if req.MaxCompletionTokens != nil {
		req.MaxTokens = req.MaxCompletionTokens
	}
	opts, err := req.options(s.defaultMaxTokens, randomSeed)
	if err != nil {
		return err
	}
	if req.TopLogProbs != nil {
		if n := *req.TopLogProbs; n < 0 || n > engine.MaxTopLogProbs {
			return badRequest("top_logprobs", "top_logprobs is %d: want a number in [0, %d]", n, engine.MaxTopLogProbs)
		}
		if !req.LogProbs && *req.TopLogProbs > 0 {
			return badRequest("top_logprobs", "top_logprobs needs logprobs: true")
		}
		opts.TopLogProbs = *req.TopLogProbs
	}
	opts.LogProbs = req.LogProbs
	if format != nil {
		if opts.Constraint, err = format(); err != nil {
			return badRequest("response_format", "%v", err)
		}
	}
	ids, err := s.m.EncodeChat(msgs)
	if err != nil {
		if errors.Is(err, engine.ErrNoChatTemplate) || errors.Is(err, engine.ErrNoTokenizer) {
			return badRequest("messages", "this model cannot chat: %v (use /v1/completions)", err)
		}
		return badRequest("messages", "%v", err)
	}
	sh := &chatShape{s: s, id: s.id("chatcmpl"), created: time.Now().Unix(), logprobs: req.LogProbs}
	return s.respond(w, r, job{ids, opts, "messages"}, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, sh)
}

func (s *server) completions(w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	if err := s.parse(r, &req); err != nil {
		return err
	}
	if req.Prompt == nil {
		return badRequest("prompt", "prompt is missing")
	}
	if req.Prompt.n != 1 {
		return badRequest("prompt", "prompt holds %d prompts: serve runs one a request", req.Prompt.n)
	}
	if req.Echo {
		return badRequest("echo", "echo is not supported")
	}
	opts, err := req.options(16, randomSeed) // OpenAI's default max_tokens for completions
	if err != nil {
		return err
	}
	if req.LogProbs != nil {
		if n := *req.LogProbs; n < 0 || n > 5 {
			return badRequest("logprobs", "logprobs is %d: want a number in [0, 5]", n)
		}
		opts.LogProbs, opts.TopLogProbs = true, *req.LogProbs
	}
	ids := req.Prompt.ids
	if ids == nil {
		if ids, err = s.m.Encode(req.Prompt.text, false); err != nil {
			return badRequest("prompt", "%v", err)
		}
	}
	if len(ids) == 0 {
		return badRequest("prompt", "prompt is empty")
	}
	for i, t := range ids {
		if t < 0 || t >= s.m.Config().VocabSize {
			return badRequest("prompt", "prompt token %d at index %d is outside the vocabulary [0, %d)", t, i, s.m.Config().VocabSize)
		}
	}
	sh := &completionShape{s: s, id: s.id("cmpl"), created: time.Now().Unix(), logprobs: req.LogProbs != nil}
	return s.respond(w, r, job{ids, opts, "prompt"}, req.Stream, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, sh)
}

// chatShape makes chat.completion and chat.completion.chunk objects.
type chatShape struct {
	s        *server
	id       string
	created  int64
	logprobs bool
}

func (c *chatShape) response(object string, ch chatChoice, u *usage) chatResponse {
	chs := []chatChoice{ch}
	if u != nil && ch.FinishReason == nil && ch.Delta == nil && ch.Message == nil {
		chs = []chatChoice{}
	}
	return chatResponse{ID: c.id, Object: object, Created: c.created, Model: c.s.name, Choices: chs, Usage: u}
}

func (c *chatShape) start() any {
	empty := ""
	return c.response("chat.completion.chunk", chatChoice{Delta: &chatMessageO{Role: "assistant", Content: &empty}}, nil)
}

func (c *chatShape) token(t engine.Token) any {
	if t.Text == "" && !c.logprobs {
		return nil
	}
	ch := chatChoice{Delta: &chatMessageO{Content: &t.Text}}
	if c.logprobs {
		ch.LogProbs = &chatLogProbs{Content: []chatLogProb{c.logProb(t)}}
	}
	return c.response("chat.completion.chunk", ch, nil)
}

func (c *chatShape) end(res *engine.Result) any {
	return c.response("chat.completion.chunk", chatChoice{Delta: &chatMessageO{}, FinishReason: finishReason(res.Reason)}, nil)
}

func (c *chatShape) usage(u *usage) any { return c.response("chat.completion.chunk", chatChoice{}, u) }

func (c *chatShape) whole(res *engine.Result, toks []engine.Token) any {
	ch := chatChoice{Message: &chatMessageO{Role: "assistant", Content: &res.Text}, FinishReason: finishReason(res.Reason)}
	if c.logprobs {
		ch.LogProbs = &chatLogProbs{Content: []chatLogProb{}}
		for _, t := range toks {
			ch.LogProbs.Content = append(ch.LogProbs.Content, c.logProb(t))
		}
	}
	r := c.response("chat.completion", ch, newUsage(res.PromptTokens, len(res.Tokens)))
	return r
}

func (c *chatShape) logProb(t engine.Token) chatLogProb {
	text := c.s.tokenText(t.ID)
	lp := chatLogProb{Token: text, LogProb: logProb(t.LogProb), Bytes: byteValues(text), TopLogProbs: []chatLogProb{}}
	for _, tl := range t.TopLogProbs {
		tt := c.s.tokenText(tl.ID)
		lp.TopLogProbs = append(lp.TopLogProbs, chatLogProb{Token: tt, LogProb: logProb(tl.LogProb), Bytes: byteValues(tt)})
	}
	return lp
}

// completionShape makes text_completion objects.
type completionShape struct {
	s        *server
	id       string
	created  int64
	logprobs bool
	offset   int // of the next token's text
}

func (c *completionShape) response(ch []completionChoice, u *usage) completionResponse {
	return completionResponse{ID: c.id, Object: "text_completion", Created: c.created, Model: c.s.name, Choices: ch, Usage: u}
}

func (c *completionShape) start() any { return nil }

func (c *completionShape) token(t engine.Token) any {
	if t.Text == "" && !c.logprobs {
		return nil
	}
	ch := completionChoice{Text: t.Text}
	if c.logprobs {
		ch.LogProbs = c.logProbs([]engine.Token{t})
	}
	return c.response([]completionChoice{ch}, nil)
}

func (c *completionShape) end(res *engine.Result) any {
	return c.response([]completionChoice{{FinishReason: finishReason(res.Reason)}}, nil)
}

func (c *completionShape) usage(u *usage) any { return c.response([]completionChoice{}, u) }

func (c *completionShape) whole(res *engine.Result, toks []engine.Token) any {
	ch := completionChoice{Text: res.Text, FinishReason: finishReason(res.Reason)}
	if c.logprobs {
		ch.LogProbs = c.logProbs(toks)
	}
	return c.response([]completionChoice{ch}, newUsage(res.PromptTokens, len(res.Tokens)))
}

func (c *completionShape) logProbs(toks []engine.Token) *completionLogProbs {
	lp := &completionLogProbs{Tokens: []string{}, TokenLogProbs: []float64{}, TopLogProbs: []map[string]float64{}, TextOffset: []int{}}
	for _, t := range toks {
		text := c.s.tokenText(t.ID)
		lp.Tokens = append(lp.Tokens, text)
		lp.TokenLogProbs = append(lp.TokenLogProbs, logProb(t.LogProb))
		top := map[string]float64{}
		for _, tl := range t.TopLogProbs {
			top[c.s.tokenText(tl.ID)] = logProb(tl.LogProb)
		}
		lp.TopLogProbs = append(lp.TopLogProbs, top)
		lp.TextOffset = append(lp.TextOffset, c.offset)
		c.offset += len(t.Text)
	}
	return lp
}
