package engine

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/tokenizer"
)

// TestGenerateText: a text prompt gives the tokens of its encoding's
// Generate and the text those tokens stream; a continuation is encoded
// without BOS; Model.GenerateText gives what a session does.
func TestGenerateText(t *testing.T) {
	dir, tok := modelWithTokenizer(t, "llama2") // adds a BOS token
	m, s := openSession(t, dir, Options{Device: "cpu", ContextLength: 256})
	ctx := context.Background()
	opts := GenerateOptions{MaxTokens: 10, StopTokens: []int{}, Sampling: SamplingOptions{Temperature: 1, Seed: 3}}
	var streamed strings.Builder
	res, err := s.GenerateText(ctx, "Hello, world", opts, func(t Token) error { streamed.WriteString(t.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := m.Encode("Hello, world", false)
	ref, _ := m.NewSession(0)
	want, err := ref.Generate(ctx, ids, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Tokens, want.Tokens) || res.Text != want.Text || res.Text != streamed.String() || res.Text == "" {
		t.Errorf("GenerateText: %v %q (streamed %q); Generate: %v %q", res.Tokens, res.Text, streamed.String(), want.Tokens, want.Text)
	}
	if full := newText(t, m, ids, res.Tokens); !strings.HasPrefix(full, res.Text) {
		t.Errorf("text %q is not the start of the tokens' %q", res.Text, full)
	}
	// The continuation: the text's own tokens, no BOS.
	n := s.Len()
	if _, err := s.GenerateText(ctx, " Again", opts, nil); err != nil {
		t.Fatal(err)
	}
	plain, _ := tok.Encode(" Again", false)
	if got := s.Tokens()[n : n+len(plain)]; !slices.Equal(got, plain) {
		t.Errorf("continued with %v, want %v", got, plain)
	}
	one, err := m.GenerateText(ctx, "Hello, world", opts)
	if err != nil || !slices.Equal(one.Tokens, res.Tokens) || one.Text != res.Text {
		t.Errorf("Model.GenerateText: %v %q %v, want %v %q", one.Tokens, one.Text, err, res.Tokens, res.Text)
	}
	// No tokenizer: an error saying so.
	g, _ := loadGolden(t, "llama")
	gs, _ := g.NewSession(16)
	if _, err := gs.GenerateText(ctx, "hi", opts, nil); !errors.Is(err, ErrNoTokenizer) {
		t.Errorf("GenerateText without a tokenizer: %v", err)
	}
}

// TestChat: the conversation goes through the chat template (system role
// included); a second turn reuses the tokens the session holds and runs only
// the new ones, generating what a fresh session over the whole conversation
// does; a model without a template says so.
func TestChat(t *testing.T) {
	dir, tok := modelWithTokenizer(t, "qwen3")
	m, err := Load(dir, Options{Device: "cpu", ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	opts := GenerateOptions{MaxTokens: 6, StopTokens: []int{}}
	conv := []Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a prime."}}
	text, err := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a prime."}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "You are terse.") {
		t.Fatalf("template dropped the system message: %q", text)
	}
	ids, _ := tok.Encode(text, false)
	s, _ := m.NewSession(0)
	var streamed strings.Builder
	res, err := s.Chat(ctx, conv, opts, func(t Token) error { streamed.WriteString(t.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Tokens(); !slices.Equal(got[:len(ids)], ids) || res.PromptTokens != len(ids) || res.Text != streamed.String() {
		t.Errorf("first turn: session %v, prompt %d tokens, text %q (streamed %q); want it to begin with %v",
			got, res.PromptTokens, res.Text, streamed.String(), ids)
	}
	one, err := m.Chat(ctx, conv, opts)
	if err != nil || !slices.Equal(one.Tokens, res.Tokens) || one.Text != res.Text {
		t.Errorf("Model.Chat: %v %q %v, want %v %q", one.Tokens, one.Text, err, res.Tokens, res.Text)
	}

	conv = append(conv, Message{Role: "assistant", Content: res.Text}, Message{Role: "user", Content: "Another."})
	full, err := m.encodeChat(conv)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Chat(ctx, conv, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if second.PromptTokens >= len(full)-len(ids) || !slices.Equal(s.Tokens()[:len(full)], full) {
		t.Errorf("second turn ran %d prompt tokens of %d (the first turn's %d were there): session %v, want it to begin with %v",
			second.PromptTokens, len(full), len(ids), s.Tokens(), full)
	}
	fresh, _ := m.NewSession(0)
	again, err := fresh.Chat(ctx, conv, opts, nil)
	if err != nil || !slices.Equal(again.Tokens, second.Tokens) {
		t.Errorf("second turn %v; a fresh session: %v %v", second.Tokens, again.Tokens, err)
	}

	// An edited history: the session drops what no longer matches.
	edited := []Message{{Role: "user", Content: "Something else entirely."}}
	if _, err := s.Chat(ctx, edited, opts, nil); err != nil {
		t.Fatal(err)
	}
	want, _ := m.encodeChat(edited)
	if !slices.Equal(s.Tokens()[:len(want)], want) {
		t.Errorf("after an edited history the session holds %v, want it to begin with %v", s.Tokens(), want)
	}
	if _, err := s.Chat(ctx, nil, opts, nil); err == nil {
		t.Error("chat of no messages accepted")
	}
	// Bad options leave the session as it was, though the conversation differs.
	held := s.Tokens()
	if _, err := s.Chat(ctx, conv, GenerateOptions{MaxTokens: -1}, nil); err == nil || !slices.Equal(s.Tokens(), held) {
		t.Errorf("chat with MaxTokens -1: %v; session %d tokens, was %d", err, s.Len(), len(held))
	}

	dir2, _ := modelWithTokenizer(t, "llama2") // no chat template
	m2, err := Load(dir2, Options{Device: "cpu", ContextLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if _, err := m2.Chat(ctx, conv, opts); !errors.Is(err, ErrNoChatTemplate) {
		t.Errorf("chat without a template: %v", err)
	}
}

// TestStream: the iterator yields Generate's tokens; breaking out keeps the
// tokens yielded in the session; a failure is the last pair.
func TestStream(t *testing.T) {
	m, ref := loadGolden(t, "llama")
	ctx := context.Background()
	prompt := ints(ref.InputIDs[:8])
	opts := GenerateOptions{MaxTokens: 12, StopTokens: []int{}, Sampling: SamplingOptions{Temperature: 0.8, TopK: 20, Seed: 4}}
	s, _ := m.NewSession(64)
	want, err := s.Generate(ctx, prompt, opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = m.NewSession(64)
	var got []int
	for tok, err := range s.Stream(ctx, prompt, opts) {
		if err != nil {
			t.Fatal(err)
		}
		if tok.Index != len(got) {
			t.Errorf("token %d has index %d", len(got), tok.Index)
		}
		got = append(got, tok.ID)
	}
	if !slices.Equal(got, want.Tokens) {
		t.Errorf("streamed %v, generated %v", got, want.Tokens)
	}
	s, _ = m.NewSession(64)
	got = got[:0]
	for tok, err := range s.Stream(ctx, prompt, opts) {
		if err != nil {
			t.Fatal(err)
		}
		if got = append(got, tok.ID); len(got) == 3 {
			break
		}
	}
	if !slices.Equal(s.Tokens(), slices.Concat(prompt, want.Tokens[:3])) {
		t.Errorf("after a break at 3 tokens the session holds %v", s.Tokens())
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	var errs []error
	for _, err := range s.Stream(cctx, []int{5}, opts) {
		errs = append(errs, err)
	}
	if len(errs) != 1 || !errors.Is(errs[0], context.Canceled) {
		t.Errorf("cancelled stream yielded errors %v", errs)
	}
}
