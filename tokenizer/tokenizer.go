package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Tokenizer turns text into token ids and back. It is safe for concurrent
// use.
type Tokenizer struct {
	src        string // the tokenizer.json path, for errors; "" from FromJSON
	normalizer normalizer
	pre        preTokenizer
	model      *bpe
	post       postProcessor
	dec        decoder
	added      addedVocab
	maxID      int

	cfg  config
	chat chatTemplate
}

// config holds what the tokenizer uses from tokenizer_config.json.
type config struct {
	bos, eos, unk, pad string
	hasBOS, hasEOS     bool
	hasUnk, hasPad     bool
	additional         []string
	addBOS             bool
	chatTemplate       string
	hasChatTemplate    bool
}

type buildOptions struct {
	scanners bool // use the hand-written pre-tokenizer scanners where they apply
	// matchTimeout bounds each regexp2 match; 0 means defaultMatchTimeout.
	// Tests set it short.
	matchTimeout time.Duration
}

// Load reads dir/tokenizer.json and, when present, dir/tokenizer_config.json
// (special tokens, chat template). A chat template in dir/chat_template.jinja
// is used when the config has none.
func Load(dir string) (*Tokenizer, error) {
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if _, err := os.Stat(cfgPath); errors.Is(err, fs.ErrNotExist) {
		cfgPath = ""
	}
	t, err := FromFiles(filepath.Join(dir, "tokenizer.json"), cfgPath)
	if err != nil {
		return nil, err
	}
	if !t.cfg.hasChatTemplate {
		jp := filepath.Join(dir, "chat_template.jinja")
		if b, err := readFile(jp); err == nil {
			t.cfg.chatTemplate, t.cfg.hasChatTemplate = string(b), true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
	}
	return t, nil
}

// FromFiles builds a tokenizer from a tokenizer.json path and an optional
// tokenizer_config.json path ("" for none).
func FromFiles(tokenizerJSON, configJSON string) (*Tokenizer, error) {
	tb, err := readFile(tokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cb []byte
	if configJSON != "" {
		if cb, err = readFile(configJSON); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
	}
	t, err := build(tb, cb, buildOptions{scanners: true})
	if err != nil {
		var fe *fieldError
		if errors.As(err, &fe) && fe.config {
			return nil, fmt.Errorf("tokenizer: %s: %w", configJSON, err)
		}
		return nil, fmt.Errorf("tokenizer: %s: %w", tokenizerJSON, err)
	}
	t.src = tokenizerJSON
	return t, nil
}

// FromJSON builds a tokenizer from the contents of tokenizer.json and,
// optionally (nil), tokenizer_config.json.
func FromJSON(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	t, err := build(tokenizerJSON, configJSON, buildOptions{scanners: true})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

type fieldError struct {
	config bool
	err    error
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

type tokenizerJSON struct {
	Version       *string          `json:"version"`
	AddedTokens   []addedToken     `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         *json.RawMessage `json:"model"`
}

type modelJSON struct {
	Type                    *string          `json:"type"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  json.RawMessage  `json:"merges"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
}

func build(tb, cb []byte, opts buildOptions) (*Tokenizer, error) {
	var tj tokenizerJSON
	if err := json.Unmarshal(tb, &tj); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if tj.Version != nil && *tj.Version != "1.0" {
		return nil, fmt.Errorf("version: unknown tokenizer version %q", *tj.Version)
	}
	if tj.Model == nil {
		return nil, errors.New("model: missing")
	}
	var mt struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(*tj.Model, &mt); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if mt.Type != nil && *mt.Type != "BPE" {
		return nil, fmt.Errorf("model.type: unsupported model %q (only BPE)", *mt.Type)
	}
	var mj modelJSON
	if err := json.Unmarshal(*tj.Model, &mj); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if mj.Type != nil && *mj.Type != "BPE" {
		return nil, fmt.Errorf("model.type: unsupported model %q (only BPE)", *mj.Type)
	}
	if mj.Type == nil && mj.Merges == nil {
		return nil, errors.New("model.type: missing and no merges (only BPE is supported)")
	}
	if mj.Dropout != nil && *mj.Dropout != 0 {
		return nil, fmt.Errorf("model.dropout: %v is not supported (BPE dropout is random)", *mj.Dropout)
	}
	merges, err := parseMerges(mj.Merges)
	if err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	model, err := newBPE(mj.Vocab, merges, str(mj.UnkToken), mj.UnkToken != nil,
		mj.FuseUnk, mj.ByteFallback, mj.IgnoreMerges,
		str(mj.ContinuingSubwordPrefix), str(mj.EndOfWordSuffix))
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: model}
	if t.normalizer, err = parseNormalizer(tj.Normalizer, "normalizer", &opts); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(tj.PreTokenizer, "pre_tokenizer", &opts); err != nil {
		return nil, err
	}
	if t.dec, err = parseDecoder(tj.Decoder, "decoder", &opts); err != nil {
		return nil, err
	}
	for i, at := range tj.AddedTokens {
		if at.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d].content: empty", i)
		}
	}
	if err := t.addTokens(tj.AddedTokens); err != nil {
		return nil, fmt.Errorf("added_tokens: normalizing the contents: %w", err)
	}
	if t.post, err = parsePostProcessor(tj.PostProcessor, "post_processor", t.TokenID); err != nil {
		return nil, err
	}
	for id := range model.vocabR {
		t.maxID = max(t.maxID, int(id))
	}
	for id := range t.added.byID {
		t.maxID = max(t.maxID, id)
	}
	if len(cb) > 0 {
		if err := t.cfg.parse(cb); err != nil {
			return nil, &fieldError{config: true, err: err}
		}
	}
	return t, nil
}

// addTokens registers the added tokens; normalizing their contents can run
// a normalizer's regex.
func (t *Tokenizer) addTokens(tokens []addedToken) (err error) {
	defer func() {
		if pe := patternFailure(recover()); pe != nil {
			err = pe
		}
	}()
	t.added.add(tokens, t.model, t.normalizer)
	return nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var pairs [][2]string
	if err := json.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return nil, errors.New(`want a list of "a b" strings or of [a, b] pairs`)
	}
	pairs = make([][2]string, 0, len(lines))
	for i, l := range lines {
		a, b, ok := strings.Cut(l, " ")
		if !ok || strings.Contains(b, " ") {
			return nil, fmt.Errorf("[%d]: %q is not two tokens separated by one space", i, l)
		}
		pairs = append(pairs, [2]string{a, b})
	}
	return pairs, nil
}

// parse reads tokenizer_config.json.
func (c *config) parse(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	tok := func(name string) (string, bool, error) {
		v, ok := raw[name]
		if !ok || isNull(v) {
			return "", false, nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			return s, true, nil
		}
		var obj struct {
			Content *string `json:"content"`
		}
		if err := json.Unmarshal(v, &obj); err != nil || obj.Content == nil {
			return "", false, fmt.Errorf("%s: want a string or an object with content", name)
		}
		return *obj.Content, true, nil
	}
	var err error
	if c.bos, c.hasBOS, err = tok("bos_token"); err != nil {
		return err
	}
	if c.eos, c.hasEOS, err = tok("eos_token"); err != nil {
		return err
	}
	if c.unk, c.hasUnk, err = tok("unk_token"); err != nil {
		return err
	}
	if c.pad, c.hasPad, err = tok("pad_token"); err != nil {
		return err
	}
	if v, ok := raw["additional_special_tokens"]; ok && !isNull(v) {
		var items []json.RawMessage
		if err := json.Unmarshal(v, &items); err != nil {
			return fmt.Errorf("additional_special_tokens: %w", err)
		}
		for i, it := range items {
			var s string
			if json.Unmarshal(it, &s) != nil {
				var obj struct {
					Content string `json:"content"`
				}
				if err := json.Unmarshal(it, &obj); err != nil {
					return fmt.Errorf("additional_special_tokens[%d]: %w", i, err)
				}
				s = obj.Content
			}
			c.additional = append(c.additional, s)
		}
	}
	if v, ok := raw["add_bos_token"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &c.addBOS); err != nil {
			return fmt.Errorf("add_bos_token: %w", err)
		}
	}
	if v, ok := raw["chat_template"]; ok && !isNull(v) {
		var s string
		if err := json.Unmarshal(v, &s); err == nil {
			c.chatTemplate, c.hasChatTemplate = s, true
		} else {
			var named []struct {
				Name     string `json:"name"`
				Template string `json:"template"`
			}
			if err := json.Unmarshal(v, &named); err != nil {
				return fmt.Errorf("chat_template: want a string or a list of {name, template}")
			}
			for _, n := range named {
				if n.Name == "default" {
					c.chatTemplate, c.hasChatTemplate = n.Template, true
				}
			}
			if !c.hasChatTemplate {
				return fmt.Errorf("chat_template: no template named \"default\"")
			}
		}
	}
	return nil
}

// VocabSize is one more than the largest token id (model and added
// tokens), the number of rows an embedding needs at least.
func (t *Tokenizer) VocabSize() int { return t.maxID + 1 }

// TokenID returns the id of a token string (added tokens first, then the
// model vocabulary).
func (t *Tokenizer) TokenID(tok string) (int, bool) {
	if id, ok := t.added.byContent[tok]; ok {
		return id, true
	}
	if id, ok := t.model.vocab[tok]; ok {
		return int(id), true
	}
	return 0, false
}

// Token returns the token string of an id.
func (t *Tokenizer) Token(id int) (string, bool) {
	if at, ok := t.added.byID[id]; ok {
		if c, ok := t.added.normCache[id]; ok {
			return c, true
		}
		return at.Content, true
	}
	s, ok := t.model.vocabR[int32(id)]
	return s, ok
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int) bool {
	at, ok := t.added.byID[id]
	return ok && t.added.special[at.Content]
}

func (t *Tokenizer) configToken(s string, ok bool) (int, bool) {
	if !ok {
		return 0, false
	}
	return t.TokenID(s)
}

// BOS returns the id of tokenizer_config.json's bos_token, if any.
func (t *Tokenizer) BOS() (int, bool) { return t.configToken(t.cfg.bos, t.cfg.hasBOS) }

// EOS returns the id of tokenizer_config.json's eos_token, if any.
func (t *Tokenizer) EOS() (int, bool) { return t.configToken(t.cfg.eos, t.cfg.hasEOS) }

// PAD returns the id of tokenizer_config.json's pad_token, if any.
func (t *Tokenizer) PAD() (int, bool) { return t.configToken(t.cfg.pad, t.cfg.hasPad) }

// AddBOSToken reports tokenizer_config.json's add_bos_token. Encode does
// not act on it (it follows tokenizer.json's post_processor, as HuggingFace
// tokenizers does); transformers' slow-tokenizer classes do.
func (t *Tokenizer) AddBOSToken() bool { return t.cfg.addBOS }

// Encode returns the token ids of text. With addSpecial the post-processor
// adds its special tokens (for example a BOS). Added and special tokens
// written in text are recognized as such. Invalid UTF-8 is first replaced
// by U+FFFD, as a lossy decode would.
//
// Encode fails only when a regex of tokenizer.json (a normalizer Replace or
// a pre_tokenizer Split pattern that no hand-written scanner covers) runs
// one match past its time limit, 1 s: the error names the pattern and the
// component using it. Such a pattern backtracks pathologically on the text.
func (t *Tokenizer) Encode(text string, addSpecial bool) (ids []int, err error) {
	defer t.catchPattern(&err)
	return t.encode(nil, text, addSpecial), nil
}

// catchPattern, deferred, recovers a regex match's failure below it into
// *err, naming the tokenizer.json it comes from.
func (t *Tokenizer) catchPattern(err *error) {
	if pe := patternFailure(recover()); pe != nil {
		*err = t.patternError(pe)
	}
}

func (t *Tokenizer) patternError(pe *patternError) error {
	if t.src != "" {
		return fmt.Errorf("tokenizer: %s: %w", t.src, pe)
	}
	return fmt.Errorf("tokenizer: %w", pe)
}

func (t *Tokenizer) encode(dst []int, text string, addSpecial bool) []int {
	text = validUTF8(text)
	var bufA, bufB [16]piece
	pieces := bufA[:0]
	if text != "" {
		pieces = append(pieces, piece{s: text, id: -1, start: true})
	}
	// 1. Added tokens matched on the raw text.
	if t.added.raw != nil {
		next := bufB[:0]
		for _, p := range pieces {
			next = t.added.splitAdded(next, p, t.added.raw)
		}
		pieces = next
	}
	// 2. Normalize text pieces, then match normalized added tokens.
	if t.normalizer != nil || t.added.norm != nil {
		var next []piece
		for _, p := range pieces {
			if p.id >= 0 {
				next = append(next, p)
				continue
			}
			if t.normalizer != nil {
				p.s = t.normalizer.normalize(p.s)
			}
			next = t.added.splitAdded(next, p, t.added.norm)
		}
		pieces = next
	}
	// 3. Pre-tokenize and run the model.
	ids := dst
	var words []piece
	for _, p := range pieces {
		if p.id >= 0 {
			ids = append(ids, p.id)
			continue
		}
		if t.pre == nil {
			ids = t.model.tokenize(ids, p.s, false)
			continue
		}
		words = t.pre.split(words[:0], p)
		for _, w := range words {
			ids = t.model.tokenize(ids, w.s, w.raw)
		}
	}
	// 4. Post-process.
	return t.post.process(ids, addSpecial)
}

// Decode turns ids into text. Unknown ids are skipped; with skipSpecial,
// special added tokens are too. Invalid byte sequences become U+FFFD.
//
// Decode fails only when a decoder Replace regex of tokenizer.json runs one
// match past its time limit, as Encode can; after a Fuse decoder such a
// pattern runs over the whole decoded text.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) (text string, err error) {
	defer t.catchPattern(&err)
	return t.decode(ids, skipSpecial), nil
}

func (t *Tokenizer) decode(ids []int, skipSpecial bool) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		s, ok := t.Token(id)
		if !ok {
			continue
		}
		if skipSpecial && t.IsSpecial(id) {
			continue
		}
		tokens = append(tokens, s)
	}
	if t.dec == nil {
		return validUTF8(strings.Join(tokens, " "))
	}
	out := t.dec.decodeChain(tokens)
	if len(out) == 1 {
		return validUTF8(out[0])
	}
	var b bytes.Buffer
	for _, s := range out {
		b.WriteString(s)
	}
	return validUTF8(b.String())
}
