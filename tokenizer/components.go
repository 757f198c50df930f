package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// piece is a span of text on its way through the pipeline.
type piece struct {
	s     string
	id    int  // >= 0: an added token, already final
	start bool // begins at offset 0 of the original input
	raw   bool // s holds raw bytes standing for byte-level characters
}

func (p piece) materialized() piece {
	if p.raw {
		p.s, p.raw = bytesToByteLevel(p.s), false
	}
	return p
}

// ---- Normalizers ----

type normalizer interface{ normalize(s string) string }

type normSequence []normalizer

func (n normSequence) normalize(s string) string {
	for _, x := range n {
		s = x.normalize(s)
	}
	return s
}

type normForm struct{ f norm.Form }

func (n normForm) normalize(s string) string { return n.f.String(s) }

type normPrepend string

func (n normPrepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return string(n) + s
}

type normReplace struct {
	m       matcher
	content string
}

func (n normReplace) normalize(s string) string { return replaceAll(s, n.m, n.content) }

func replaceAll(s string, m matcher, content string) string {
	var sb strings.Builder
	prev := 0
	forEachMatch(m, s, func(st, e int) {
		sb.WriteString(s[prev:st])
		sb.WriteString(content)
		prev = e
	})
	if prev == 0 && sb.Len() == 0 {
		return s
	}
	sb.WriteString(s[prev:])
	return sb.String()
}

type normStrip struct{ left, right bool }

func (n normStrip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, isWhiteSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, isWhiteSpace)
	}
	return s
}

type normStripAccents struct{}

func (normStripAccents) normalize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsMark(r) {
			return -1
		}
		return r
	}, s)
}

type normLowercase struct{}

// normalize lowercases like Rust's str::to_lowercase: full mappings
// (U+0130) and the final-sigma rule.
func (normLowercase) normalize(s string) string {
	var sb strings.Builder
	for i, r := range s {
		switch {
		case r == 'İ':
			sb.WriteString("i\u0307")
		case r == 'Σ':
			if finalSigma(s, i) {
				sb.WriteRune('ς')
			} else {
				sb.WriteRune('σ')
			}
		default:
			sb.WriteRune(unicode.ToLower(r))
		}
	}
	return sb.String()
}

func isCased(r rune) bool { return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r) }
func isCaseIgnorable(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) || r == '\'' || r == '.' || r == ':' || r == '·'
}

func finalSigma(s string, i int) bool {
	before := false
	for j := i; j > 0; {
		r, n := utf8.DecodeLastRuneInString(s[:j])
		j -= n
		if isCaseIgnorable(r) {
			continue
		}
		before = isCased(r)
		break
	}
	if !before {
		return false
	}
	for _, r := range s[i+len("Σ"):] {
		if isCaseIgnorable(r) {
			continue
		}
		return !isCased(r)
	}
	return true
}

type normByteLevel struct{}

func (normByteLevel) normalize(s string) string { return bytesToByteLevel(s) }

// ---- Pre-tokenizers ----

type preTokenizer interface {
	// split appends the pieces of p (a text piece) to dst.
	split(dst []piece, p piece) []piece
}

type splitBehavior int

const (
	behRemoved splitBehavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Removed":
		return behRemoved, nil
	case "Isolated":
		return behIsolated, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// charMatcher matches single characters satisfying a predicate, each one a
// match of its own (tokenizers' Pattern for Fn(char) -> bool).
type charMatcher func(rune) bool

func (f charMatcher) find(s string, at int) (int, int) {
	for i := at; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if f(r) {
			return i, i + n
		}
		i += n
	}
	return -1, -1
}

type span struct {
	start, end int
	match      bool
}

// splitPiece is NormalizedString::split: the pieces of p cut by the
// matches of m, arranged by behavior; empty pieces are dropped.
func splitPiece(dst []piece, p piece, m matcher, behavior splitBehavior, invert bool) []piece {
	s := p.s
	emit := func(a, b int) {
		if a < b {
			dst = append(dst, piece{s: s[a:b], id: -1, start: p.start && a == 0, raw: p.raw})
		}
	}
	if behavior == behIsolated {
		prev := 0
		forEachMatch(m, s, func(st, e int) {
			emit(prev, st)
			emit(st, e)
			prev = e
		})
		emit(prev, len(s))
		return dst
	}
	var spans []span
	prev := 0
	forEachMatch(m, s, func(st, e int) {
		if prev != st {
			spans = append(spans, span{prev, st, invert})
		}
		spans = append(spans, span{st, e, !invert})
		prev = e
	})
	if prev != len(s) {
		spans = append(spans, span{prev, len(s), invert})
	}
	var out []span
	switch behavior {
	case behRemoved:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case behContiguous, behMergedWithPrevious:
		// Contiguous joins each span to a previous one of its kind; merged
		// with previous joins a match to the non-match before it.
		prevMatch := false
		for _, sp := range spans {
			join := sp.match == prevMatch
			if behavior == behMergedWithPrevious {
				join = sp.match && !prevMatch
			}
			if join && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
	case behMergedWithNext:
		prevMatch := false
		for k := len(spans) - 1; k >= 0; k-- {
			sp := spans[k]
			if sp.match && !prevMatch && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, span{sp.start, sp.end, false})
			}
			prevMatch = sp.match
		}
		for a, b := 0, len(out)-1; a < b; a, b = a+1, b-1 {
			out[a], out[b] = out[b], out[a]
		}
	}
	for _, sp := range out {
		emit(sp.start, sp.end)
	}
	return dst
}

type preSequence []preTokenizer

func (q preSequence) split(dst []piece, p piece) []piece {
	cur := []piece{p}
	var next []piece
	for _, pt := range q {
		next = next[:0]
		for _, x := range cur {
			next = pt.split(next, x)
		}
		cur, next = next, cur
	}
	return append(dst, cur...)
}

type preSplit struct {
	m        matcher
	behavior splitBehavior
	invert   bool
}

func (ps preSplit) split(dst []piece, p piece) []piece {
	return splitPiece(dst, p.materialized(), ps.m, ps.behavior, ps.invert)
}

type preByteLevel struct {
	addPrefixSpace bool
	re             matcher // nil when use_regex is false
}

func (b preByteLevel) split(dst []piece, p piece) []piece {
	p = p.materialized()
	if b.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	n := len(dst)
	if b.re != nil {
		dst = splitPiece(dst, p, b.re, behIsolated, false)
	} else if p.s != "" {
		dst = append(dst, p)
	}
	for i := n; i < len(dst); i++ {
		dst[i].raw = true
	}
	return dst
}

type preMetaspace struct {
	repl    rune
	scheme  string // "always", "first", "never"
	doSplit bool
}

func (mt preMetaspace) split(dst []piece, p piece) []piece {
	p = p.materialized()
	rs := string(mt.repl)
	p.s = strings.ReplaceAll(p.s, " ", rs)
	if !strings.HasPrefix(p.s, rs) && (mt.scheme == "always" || mt.scheme == "first" && p.start) {
		p.s = rs + p.s
	}
	if !mt.doSplit {
		if p.s != "" {
			dst = append(dst, p)
		}
		return dst
	}
	return splitPiece(dst, p, charMatcher(func(r rune) bool { return r == mt.repl }), behMergedWithNext, false)
}

func isRustPunct(r rune) bool {
	return r < utf8.RuneSelf && isASCIIPunct(byte(r)) || unicode.IsPunct(r)
}

// ---- Decoders ----

type decoder interface {
	decodeChain(tokens []string) []string
}

type decSequence []decoder

func (d decSequence) decodeChain(t []string) []string {
	for _, x := range d {
		t = x.decodeChain(t)
	}
	return t
}

type decByteLevel struct{}

func (decByteLevel) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		if raw, ok := byteLevelToBytes(t); ok {
			buf = append(buf, raw...)
		} else {
			buf = append(buf, t...)
		}
	}
	return []string{string(appendLossy(nil, buf))}
}

type decMetaspace struct {
	repl   rune
	scheme string
}

func (d decMetaspace) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		var sb strings.Builder
		for _, r := range t {
			if r == d.repl {
				if i == 0 && d.scheme != "never" {
					continue
				}
				r = ' '
			}
			sb.WriteRune(r)
		}
		out[i] = sb.String()
	}
	return out
}

type decReplace struct {
	m       matcher
	content string
}

func (d decReplace) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = replaceAll(t, d.m, d.content)
	}
	return out
}

type decByteFallback struct{}

func (decByteFallback) decodeChain(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// parseByteToken parses "<0xNN>" (hex digits in either case, as
// u8::from_str_radix).
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

type decFuse struct{}

func (decFuse) decodeChain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

type decStrip struct {
	content     rune
	start, stop int
}

func (d decStrip) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rs := []rune(t)
		a := 0
		for k := 0; k < d.start && k < len(rs); k++ {
			if rs[k] != d.content {
				break
			}
			a = k + 1
		}
		b := len(rs)
		for k := 0; k < d.stop; k++ {
			idx := len(rs) - k - 1
			if idx < 0 || rs[idx] != d.content {
				break
			}
			b = idx
		}
		if b < a {
			b = a
		}
		out[i] = string(rs[a:b])
	}
	return out
}

type decBPE struct{ suffix string }

func (d decBPE) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rep := " "
		if i == len(tokens)-1 {
			rep = ""
		}
		out[i] = strings.ReplaceAll(t, d.suffix, rep)
	}
	return out
}

// ---- Post-processors ----

type postProcessor interface {
	process(ids []int, addSpecial bool) []int
}

type postNone struct{}

func (postNone) process(ids []int, _ bool) []int { return ids }

type postTemplate struct{ pieces []templatePiece }

type templatePiece struct {
	sequence bool  // true: the input sequence ($A)
	ids      []int // special-token ids otherwise
}

func (t postTemplate) process(ids []int, addSpecial bool) []int {
	var out []int
	for _, p := range t.pieces {
		if p.sequence {
			out = append(out, ids...)
		} else if addSpecial {
			out = append(out, p.ids...)
		}
	}
	return out
}

type postWrap struct{ cls, sep int } // BertProcessing, RobertaProcessing

func (w postWrap) process(ids []int, addSpecial bool) []int {
	if !addSpecial {
		return ids
	}
	out := make([]int, 0, len(ids)+2)
	out = append(out, w.cls)
	out = append(out, ids...)
	return append(out, w.sep)
}

type postSequence []postProcessor

func (q postSequence) process(ids []int, addSpecial bool) []int {
	for _, p := range q {
		ids = p.process(ids, addSpecial)
	}
	return ids
}

// ---- JSON ----

// component is the common shape of tokenizer.json components.
type component struct {
	Type string `json:"type"`

	// Sequence members
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`

	Pattern  *patternJSON `json:"pattern"`
	Content  *string      `json:"content"`
	Prepend  *string      `json:"prepend"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`

	AddPrefixSpace *bool   `json:"add_prefix_space"`
	UseRegex       *bool   `json:"use_regex"`
	Replacement    *string `json:"replacement"`
	PrependScheme  *string `json:"prepend_scheme"`
	Split          *bool   `json:"split"`

	IndividualDigits bool    `json:"individual_digits"`
	Delimiter        *string `json:"delimiter"`
	StripLeft        bool    `json:"strip_left"`
	StripRight       bool    `json:"strip_right"`
	Start            int     `json:"start"`
	Stop             int     `json:"stop"`
	Suffix           *string `json:"suffix"`

	Single        []json.RawMessage          `json:"single"`
	SpecialTokens map[string]specialTokenSet `json:"special_tokens"`
	Cls           []json.RawMessage          `json:"cls"`
	Sep           []json.RawMessage          `json:"sep"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type specialTokenSet struct {
	ID     string   `json:"id"`
	IDs    []int    `json:"ids"`
	Tokens []string `json:"tokens"`
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}

func (c *component) pattern(field string, opts *buildOptions) (matcher, error) {
	if c.Pattern == nil {
		return nil, fmt.Errorf("%s.pattern: missing", field)
	}
	switch {
	case c.Pattern.String != nil:
		return compilePattern(*c.Pattern.String, true, "", opts)
	case c.Pattern.Regex != nil:
		m, err := compilePattern(*c.Pattern.Regex, false, field+" "+c.Type, opts)
		if err != nil {
			return nil, fmt.Errorf("%s.pattern.Regex: %w", field, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s.pattern: neither String nor Regex", field)
}

// decodeComponent reads one component object; a null or empty one is nil
// with no error.
func decodeComponent(raw json.RawMessage, field string) (*component, error) {
	if isNull(raw) {
		return nil, nil
	}
	c := new(component)
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return c, nil
}

// replace reads the pattern and content of a Replace normalizer or decoder.
func (c *component) replace(field string, opts *buildOptions) (matcher, string, error) {
	m, err := c.pattern(field, opts)
	if err != nil {
		return nil, "", err
	}
	if c.Content == nil {
		return nil, "", fmt.Errorf("%s.content: missing", field)
	}
	return m, *c.Content, nil
}

func oneRune(field, s string) (rune, error) {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 || n != len(s) {
		return 0, fmt.Errorf("%s: want exactly one character, got %q", field, s)
	}
	return r, nil
}

func parseNormalizer(raw json.RawMessage, field string, opts *buildOptions) (normalizer, error) {
	c, err := decodeComponent(raw, field)
	if c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		seq, err := parseEach(c.Normalizers, field+".normalizers", func(r json.RawMessage, f string) (normalizer, error) { return parseNormalizer(r, f, opts) })
		return normSequence(seq), err
	case "NFC":
		return normForm{norm.NFC}, nil
	case "NFD":
		return normForm{norm.NFD}, nil
	case "NFKC":
		return normForm{norm.NFKC}, nil
	case "NFKD":
		return normForm{norm.NFKD}, nil
	case "Prepend":
		if c.Prepend == nil {
			return nil, fmt.Errorf("%s.prepend: missing", field)
		}
		return normPrepend(*c.Prepend), nil
	case "Replace":
		m, content, err := c.replace(field, opts)
		if err != nil {
			return nil, err
		}
		return normReplace{m, content}, nil
	case "Strip":
		return normStrip{c.StripLeft, c.StripRight}, nil
	case "StripAccents":
		return normStripAccents{}, nil
	case "Lowercase":
		return normLowercase{}, nil
	case "ByteLevel":
		return normByteLevel{}, nil
	}
	return nil, fmt.Errorf("%s.type: unsupported normalizer %q", field, c.Type)
}

func parsePreTokenizer(raw json.RawMessage, field string, opts *buildOptions) (preTokenizer, error) {
	c, err := decodeComponent(raw, field)
	if c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		seq, err := parseEach(c.Pretokenizers, field+".pretokenizers", func(r json.RawMessage, f string) (preTokenizer, error) { return parsePreTokenizer(r, f, opts) })
		return preSequence(seq), err
	case "Split":
		m, err := c.pattern(field, opts)
		if err != nil {
			return nil, err
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("%s.behavior: %w", field, err)
		}
		return preSplit{m, b, c.Invert}, nil
	case "ByteLevel":
		b := preByteLevel{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			m, err := compilePattern(patGPT2, false, field+" ByteLevel", opts)
			if err != nil {
				return nil, err
			}
			b.re = m
		}
		return b, nil
	case "Metaspace":
		mt := preMetaspace{repl: '▁', scheme: "always", doSplit: c.Split == nil || *c.Split}
		if c.Replacement != nil {
			r, err := oneRune(field+".replacement", *c.Replacement)
			if err != nil {
				return nil, err
			}
			mt.repl = r
		}
		if c.PrependScheme != nil {
			mt.scheme = *c.PrependScheme
		}
		if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
			if c.PrependScheme != nil && mt.scheme != "never" {
				return nil, fmt.Errorf("%s: add_prefix_space does not match prepend_scheme", field)
			}
			mt.scheme = "never"
		}
		switch mt.scheme {
		case "always", "first", "never":
		default:
			return nil, fmt.Errorf("%s.prepend_scheme: unknown value %q", field, mt.scheme)
		}
		return mt, nil
	case "Digits":
		b := behContiguous
		if c.IndividualDigits {
			b = behIsolated
		}
		return preSplit{charMatcher(unicode.IsNumber), b, false}, nil
	case "WhitespaceSplit":
		return preSplit{charMatcher(isWhiteSpace), behRemoved, false}, nil
	case "Punctuation":
		b := behIsolated
		if c.Behavior != "" {
			var err error
			if b, err = parseBehavior(c.Behavior); err != nil {
				return nil, fmt.Errorf("%s.behavior: %w", field, err)
			}
		}
		return preSplit{charMatcher(isRustPunct), b, false}, nil
	case "CharDelimiterSplit":
		if c.Delimiter == nil {
			return nil, fmt.Errorf("%s.delimiter: missing", field)
		}
		d, err := oneRune(field+".delimiter", *c.Delimiter)
		if err != nil {
			return nil, err
		}
		return preSplit{charMatcher(func(r rune) bool { return r == d }), behRemoved, false}, nil
	}
	return nil, fmt.Errorf("%s.type: unsupported pre-tokenizer %q", field, c.Type)
}

func parseDecoder(raw json.RawMessage, field string, opts *buildOptions) (decoder, error) {
	c, err := decodeComponent(raw, field)
	if c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		seq, err := parseEach(c.Decoders, field+".decoders", func(r json.RawMessage, f string) (decoder, error) { return parseDecoder(r, f, opts) })
		return decSequence(seq), err
	case "ByteLevel":
		return decByteLevel{}, nil
	case "Metaspace":
		p, err := parsePreTokenizer(raw, field, opts)
		if err != nil {
			return nil, err
		}
		mt := p.(preMetaspace)
		return decMetaspace{mt.repl, mt.scheme}, nil
	case "Replace":
		m, content, err := c.replace(field, opts)
		if err != nil {
			return nil, err
		}
		return decReplace{m, content}, nil
	case "ByteFallback":
		return decByteFallback{}, nil
	case "Fuse":
		return decFuse{}, nil
	case "Strip":
		if c.Content == nil {
			return nil, fmt.Errorf("%s.content: missing", field)
		}
		r, err := oneRune(field+".content", *c.Content)
		if err != nil {
			return nil, err
		}
		return decStrip{r, c.Start, c.Stop}, nil
	case "BPEDecoder":
		suffix := "</w>"
		if c.Suffix != nil {
			suffix = *c.Suffix
		}
		return decBPE{suffix}, nil
	}
	return nil, fmt.Errorf("%s.type: unsupported decoder %q", field, c.Type)
}

func parsePostProcessor(raw json.RawMessage, field string, tokenID func(string) (int, bool)) (postProcessor, error) {
	c, err := decodeComponent(raw, field)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return postNone{}, nil
	}
	switch c.Type {
	case "Sequence":
		var seq postSequence
		for i, r := range c.Processors {
			p, err := parsePostProcessor(r, fmt.Sprintf("%s.processors[%d]", field, i), tokenID)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "ByteLevel":
		return postNone{}, nil
	case "TemplateProcessing":
		return parseTemplateProcessing(c, field)
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPair(c.Cls, field+".cls")
		if err != nil {
			return nil, err
		}
		sep, err := tokenPair(c.Sep, field+".sep")
		if err != nil {
			return nil, err
		}
		return postWrap{cls, sep}, nil
	}
	return nil, fmt.Errorf("%s.type: unsupported post-processor %q", field, c.Type)
}

func tokenPair(raw []json.RawMessage, field string) (int, error) {
	if len(raw) != 2 {
		return 0, fmt.Errorf("%s: want [token, id]", field)
	}
	var id int
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, fmt.Errorf("%s[1]: %w", field, err)
	}
	return id, nil
}

func parseTemplateProcessing(c *component, field string) (postProcessor, error) {
	var t postTemplate
	if len(c.Single) == 0 {
		return nil, fmt.Errorf("%s.single: missing or empty", field)
	}
	for i, raw := range c.Single {
		var p struct {
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("%s.single[%d]: %w (only the list form of templates is supported)", field, i, err)
		}
		switch {
		case p.Sequence != nil:
			if p.Sequence.ID != "A" {
				return nil, fmt.Errorf("%s.single[%d]: sequence %q in a single template", field, i, p.Sequence.ID)
			}
			t.pieces = append(t.pieces, templatePiece{sequence: true})
		case p.SpecialToken != nil:
			st, ok := c.SpecialTokens[p.SpecialToken.ID]
			if !ok {
				return nil, fmt.Errorf("%s.single[%d]: special token %q missing from special_tokens", field, i, p.SpecialToken.ID)
			}
			t.pieces = append(t.pieces, templatePiece{ids: st.IDs})
		default:
			return nil, fmt.Errorf("%s.single[%d]: neither Sequence nor SpecialToken", field, i)
		}
	}
	return t, nil
}

// parseEach parses the items of a Sequence component (naming them field[i]
// in errors), dropping the ones that parse to nothing.
func parseEach[T comparable](items []json.RawMessage, field string, parse func(json.RawMessage, string) (T, error)) ([]T, error) {
	var out []T
	var none T
	for i, r := range items {
		p, err := parse(r, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		if p != none {
			out = append(out, p)
		}
	}
	return out, nil
}
