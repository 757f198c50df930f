package tokenizer

import (
	"errors"
	"fmt"
	"sync"
)

// Message is one chat turn.
type Message struct {
	Role    string
	Content string
}

// chatTemplate is the parsed chat template, built on first use.
type chatTemplate struct {
	once  sync.Once
	nodes []jnode
	err   error
}

// ErrNoChatTemplate is returned by ApplyChatTemplate when the tokenizer has
// no chat template.
var ErrNoChatTemplate = errors.New("tokenizer: no chat_template in tokenizer_config.json")

// HasChatTemplate reports whether a chat template was loaded.
func (t *Tokenizer) HasChatTemplate() bool { return t.cfg.hasChatTemplate }

// ApplyChatTemplate renders the chat template with msgs the way
// transformers' apply_chat_template does (tools and documents None), and
// returns the prompt text; encode it with Encode(prompt, false), as the
// template writes the special tokens itself. A template that uses a
// feature outside the supported Jinja subset, or that raises, is an error.
func (t *Tokenizer) ApplyChatTemplate(msgs []Message, addGenerationPrompt bool) (string, error) {
	if !t.cfg.hasChatTemplate {
		return "", ErrNoChatTemplate
	}
	ct := &t.chat
	ct.once.Do(func() {
		toks, err := lexTemplate(t.cfg.chatTemplate)
		if err == nil {
			ct.nodes, err = parseTemplate(toks)
		}
		ct.err = err
	})
	if ct.err != nil {
		return "", fmt.Errorf("tokenizer: chat_template: %w", ct.err)
	}
	vars := t.chatVars(msgs, addGenerationPrompt)
	out, err := renderJinja(ct.nodes, vars)
	if err != nil {
		return "", fmt.Errorf("tokenizer: chat_template: %w", err)
	}
	return out, nil
}

// RenderChatTemplate renders an arbitrary template text with the same
// variables as ApplyChatTemplate (for templates stored elsewhere).
func (t *Tokenizer) RenderChatTemplate(template string, msgs []Message, addGenerationPrompt bool) (string, error) {
	toks, err := lexTemplate(template)
	if err != nil {
		return "", err
	}
	nodes, err := parseTemplate(toks)
	if err != nil {
		return "", err
	}
	return renderJinja(nodes, t.chatVars(msgs, addGenerationPrompt))
}

func (t *Tokenizer) chatVars(msgs []Message, addGenerationPrompt bool) map[string]jvalue {
	list := make([]jvalue, len(msgs))
	for i, m := range msgs {
		d := newDict()
		d.set("role", m.Role)
		d.set("content", m.Content)
		list[i] = d
	}
	vars := map[string]jvalue{
		"messages":              list,
		"add_generation_prompt": addGenerationPrompt,
		"tools":                 nil,
		"documents":             nil,
	}
	c := &t.cfg
	if c.hasBOS {
		vars["bos_token"] = c.bos
	}
	if c.hasEOS {
		vars["eos_token"] = c.eos
	}
	if c.hasUnk {
		vars["unk_token"] = c.unk
	}
	if c.hasPad {
		vars["pad_token"] = c.pad
	}
	if len(c.additional) > 0 {
		add := make([]jvalue, len(c.additional))
		for i, s := range c.additional {
			add[i] = s
		}
		vars["additional_special_tokens"] = add
	}
	return vars
}
