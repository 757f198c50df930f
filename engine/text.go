package engine

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/manifoldlm/manifold/tokenizer"
)

// Message is one turn of a chat.
type Message struct {
	// Role is "system", "user" or "assistant" (or another role the model's
	// chat template knows).
	Role    string
	Content string
}

// ErrNoChatTemplate is wrapped by the error of a chat call on a model whose
// tokenizer_config.json has no chat template (tokenizer.ErrNoChatTemplate).
var ErrNoChatTemplate = tokenizer.ErrNoChatTemplate

// GenerateText is Generate with a text prompt; the generated text is
// Result.Text (and each Token.Text as streamed). The prompt is encoded as
// Model.Encode does, with the tokenizer's special tokens and BOS, when the
// session is empty; when it continues a session, as plain text (no BOS in
// the middle of a conversation). The model needs a tokenizer.json.
func (s *Session) GenerateText(ctx context.Context, prompt string, opts GenerateOptions, stream func(Token) error) (*Result, error) {
	if err := s.m.closing(); err != nil {
		return nil, err
	}
	ids, err := s.encode(prompt)
	if err != nil {
		return nil, err
	}
	return s.Generate(ctx, ids, opts, stream)
}

// encode turns prompt into the ids GenerateText appends.
func (s *Session) encode(prompt string) ([]int, error) {
	m := s.m
	if s.Len() == 0 {
		return m.Encode(prompt, false)
	}
	if m.tok == nil {
		return nil, fmt.Errorf("engine: %s: %w (pass token ids instead)", m.dir, ErrNoTokenizer)
	}
	ids, err := m.tok.Encode(prompt, false)
	if err != nil {
		return nil, fmt.Errorf("engine: encode: %w", err)
	}
	return ids, nil
}

// Chat generates the reply to a conversation: msgs is the whole
// conversation so far (a system message, user and assistant turns), which
// the model's chat template renders with the prompt of an assistant turn;
// the reply is Result.Text. The session keeps the tokens it holds that
// begin the rendered conversation (the previous turns, when msgs extends the
// conversation of an earlier Chat call by the reply and a new user turn),
// drops the rest and runs only what follows, so a conversation costs no
// prefill of the turns already run. The model needs a tokenizer.json with a
// chat template (else the error wraps ErrNoChatTemplate).
func (s *Session) Chat(ctx context.Context, msgs []Message, opts GenerateOptions, stream func(Token) error) (*Result, error) {
	if err := s.m.closing(); err != nil {
		return nil, err
	}
	ids, err := s.m.encodeChat(msgs)
	if err != nil {
		return nil, err
	}
	// Errors about the arguments leave the session as it was, as Generate's do.
	if err := s.m.checkOptions(opts); err != nil {
		return nil, err
	}
	if len(ids) > s.ContextLength() {
		return nil, fmt.Errorf("engine: chat of %d tokens is longer than the context of %d positions: %w", len(ids), s.ContextLength(), ErrContextFull)
	}
	n := 0
	for n < len(ids) && n < len(s.tokens) && ids[n] == s.tokens[n] {
		n++
	}
	if n < len(s.tokens) {
		s.Truncate(n)
	}
	return s.Generate(ctx, ids[n:], opts, stream)
}

// encodeChat renders msgs through the chat template, with the generation
// prompt, and encodes the result (the template writes the special tokens).
func (m *Model) encodeChat(msgs []Message) ([]int, error) {
	if m.tok == nil {
		return nil, fmt.Errorf("engine: %s: %w", m.dir, ErrNoTokenizer)
	}
	if len(msgs) == 0 {
		return nil, errors.New("engine: chat: no messages")
	}
	tm := make([]tokenizer.Message, len(msgs))
	for i, msg := range msgs {
		tm[i] = tokenizer.Message{Role: msg.Role, Content: msg.Content}
	}
	prompt, err := m.tok.ApplyChatTemplate(tm, true)
	if err != nil {
		return nil, fmt.Errorf("engine: chat template of %s: %w", m.dir, err)
	}
	ids, err := m.tok.Encode(prompt, false)
	if err != nil {
		return nil, fmt.Errorf("engine: encode: %w", err)
	}
	return ids, nil
}

// GenerateText generates text after prompt in a session of its own (sized
// to the prompt and opts.MaxTokens when that is set, else the model's
// ContextLength); see Session.GenerateText. Use a Session to stream or to
// continue the text.
func (m *Model) GenerateText(ctx context.Context, prompt string, opts GenerateOptions) (*Result, error) {
	return m.oneShot(ctx, opts, func() ([]int, error) { return m.Encode(prompt, false) })
}

// Chat generates the reply to the conversation msgs in a session of its
// own, as GenerateText does; see Session.Chat. Use a Session to stream the
// reply or to carry the conversation on without running it again.
func (m *Model) Chat(ctx context.Context, msgs []Message, opts GenerateOptions) (*Result, error) {
	return m.oneShot(ctx, opts, func() ([]int, error) { return m.encodeChat(msgs) })
}

// oneShot generates after the ids encode gives in a session of its own.
func (m *Model) oneShot(ctx context.Context, opts GenerateOptions, encode func() ([]int, error)) (*Result, error) {
	if err := m.closing(); err != nil {
		return nil, err
	}
	ids, err := encode()
	if err != nil {
		return nil, err
	}
	s, err := m.NewSession(m.oneShotLength(len(ids), opts))
	if err != nil {
		return nil, err
	}
	return s.Generate(ctx, ids, opts, nil)
}

// oneShotLength is the context of a session that only generates after a
// prompt of n tokens with opts.
func (m *Model) oneShotLength(n int, opts GenerateOptions) int {
	if opts.MaxTokens > 0 && n+opts.MaxTokens < m.ctxLen {
		return n + opts.MaxTokens
	}
	return m.ctxLen
}

// errStopIteration ends a Generate whose Stream consumer stopped early.
var errStopIteration = errors.New("engine: stream consumer stopped")

// Stream is Generate as an iterator: it yields each token as it is chosen
// and, if generation fails, a last pair with the error (as Generate's, with
// ctx's cancellation and ErrClosed). Breaking out of the loop stops
// generation; the session then holds the tokens yielded, as after a
// cancellation. The stop reason and timings are not reported: use Generate
// with a callback for them. Token.Text is the text to print (Model.Encode
// turns a text prompt into ids).
//
//	for tok, err := range s.Stream(ctx, ids, opts) {
//		if err != nil {
//			return err
//		}
//		fmt.Print(tok.Text)
//	}
func (s *Session) Stream(ctx context.Context, prompt []int, opts GenerateOptions) iter.Seq2[Token, error] {
	return func(yield func(Token, error) bool) {
		stopped := false
		_, err := s.Generate(ctx, prompt, opts, func(t Token) error {
			if !yield(t, nil) {
				stopped = true
				return errStopIteration
			}
			return nil
		})
		if err != nil && !stopped {
			yield(Token{}, err)
		}
	}
}
