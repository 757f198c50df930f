package tokenizer

import (
	"fmt"
	"strings"
)

// This file and jinja_*.go implement the subset of Jinja2 that chat
// templates use, with the settings transformers renders them with
// (trim_blocks, lstrip_blocks, loop controls, sandboxed: no attribute
// access beyond data and known methods). Anything outside the subset is an
// error naming the construct, never a guess.

type jtokKind int

const (
	jText jtokKind = iota
	jName
	jString
	jInt
	jFloat
	jOp
	jVarBegin   // {{
	jVarEnd     // }}
	jBlockBegin // {%
	jBlockEnd   // %}
	jEOF
)

type jtok struct {
	kind jtokKind
	val  string
	pos  int // byte offset in the template
}

// jlexer splits a template into text and tag tokens.
type jlexer struct {
	src  string
	toks []jtok
}

func isSpaceTab(c byte) bool { return c == ' ' || c == '\t' }

// lexTemplate tokenizes src, applying whitespace control ("-"), trim_blocks
// and lstrip_blocks as Jinja2's lexer does.
func lexTemplate(src string) ([]jtok, error) {
	// keep_trailing_newline=False: drop one trailing newline of the source.
	src = strings.TrimSuffix(src, "\n")
	lx := &jlexer{src: src}
	pos := 0
	stripNextLeading := false // a "-" on the previous tag's end
	for pos < len(src) {
		// Find the next tag start.
		next := -1
		for i := pos; i+1 < len(src); i++ {
			if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
				next = i
				break
			}
		}
		end := len(src)
		if next >= 0 {
			end = next
		}
		text := src[pos:end]
		if stripNextLeading {
			text = strings.TrimLeft(text, " \t\n\r\v\f")
			stripNextLeading = false
		}
		if next >= 0 {
			kind := src[next+1]
			mod := byte(0)
			if next+2 < len(src) {
				mod = src[next+2]
			}
			if mod == '-' {
				text = strings.TrimRight(text, " \t\n\r\v\f")
			} else if kind != '{' && mod != '+' {
				// lstrip_blocks: drop spaces and tabs between the line
				// start and a block or comment tag.
				k := len(text)
				for k > 0 && isSpaceTab(text[k-1]) {
					k--
				}
				if k == 0 && (end-len(text) == 0 || src[end-len(text)-1] == '\n') || k > 0 && text[k-1] == '\n' {
					text = text[:k]
				}
			}
		}
		if text != "" {
			lx.toks = append(lx.toks, jtok{kind: jText, val: text, pos: pos})
		}
		if next < 0 {
			break
		}
		kind := src[next+1]
		p := next + 2
		if p < len(src) && (src[p] == '-' || src[p] == '+') {
			p++
		}
		switch kind {
		case '#':
			e := strings.Index(src[p:], "#}")
			if e < 0 {
				return nil, fmt.Errorf("chat template: unclosed comment at offset %d", next)
			}
			e += p
			after := e + 2
			if e > p && src[e-1] == '-' {
				stripNextLeading = true
			} else if !(e > p && src[e-1] == '+') && after < len(src) && src[after] == '\n' {
				after++ // trim_blocks
			}
			pos = after
		case '{', '%':
			begin, endTok, closer := jVarBegin, jVarEnd, "}}"
			if kind == '%' {
				begin, endTok, closer = jBlockBegin, jBlockEnd, "%}"
			}
			lx.toks = append(lx.toks, jtok{kind: begin, pos: next})
			q, err := lx.lexExpr(p, closer)
			if err != nil {
				return nil, err
			}
			// q points at the closer (possibly preceded by - or +).
			after := q + 2
			if q > 0 && src[q-1] == '-' && q-1 >= p {
				stripNextLeading = true
			} else if kind == '%' && !(q > 0 && src[q-1] == '+' && q-1 >= p) && after < len(src) && src[after] == '\n' {
				after++ // trim_blocks
			}
			lx.toks = append(lx.toks, jtok{kind: endTok, pos: q})
			pos = after
			if kind == '%' && lx.isRawStart() {
				// {% raw %}: copy text verbatim up to {% endraw %}.
				r := strings.Index(src[pos:], "{%")
				for r >= 0 {
					inner := strings.TrimSpace(strings.Trim(strings.TrimSpace(src[pos+r+2:min(len(src), pos+r+40)]), "-+"))
					if strings.HasPrefix(inner, "endraw") {
						break
					}
					nr := strings.Index(src[pos+r+2:], "{%")
					if nr < 0 {
						r = -1
						break
					}
					r += 2 + nr
				}
				if r < 0 {
					return nil, fmt.Errorf("chat template: unclosed raw block at offset %d", next)
				}
				lx.toks = append(lx.toks, jtok{kind: jText, val: src[pos : pos+r], pos: pos})
				pos += r
			}
		}
	}
	lx.toks = append(lx.toks, jtok{kind: jEOF, pos: len(src)})
	return lx.toks, nil
}

// isRawStart reports whether the last block tag was {% raw %}.
func (lx *jlexer) isRawStart() bool {
	n := len(lx.toks)
	return n >= 3 && lx.toks[n-3].kind == jBlockBegin && lx.toks[n-2].kind == jName && lx.toks[n-2].val == "raw"
}

var jOps = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

// lexExpr tokenizes an expression up to closer and returns the offset of
// the closer (minus a whitespace-control sign).
func (lx *jlexer) lexExpr(p int, closer string) (int, error) {
	src := lx.src
	depth := 0
	for p < len(src) {
		c := src[p]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			p++
			continue
		case depth == 0 && strings.HasPrefix(src[p:], closer):
			return p, nil
		case depth == 0 && (c == '-' || c == '+') && strings.HasPrefix(src[p+1:], closer):
			return p + 1, nil
		case c == '"' || c == '\'':
			s, n, err := lexString(src[p:])
			if err != nil {
				return 0, fmt.Errorf("chat template: offset %d: %w", p, err)
			}
			lx.toks = append(lx.toks, jtok{kind: jString, val: s, pos: p})
			p += n
			continue
		case c >= '0' && c <= '9':
			q := p
			for q < len(src) && (src[q] >= '0' && src[q] <= '9' || src[q] == '_') {
				q++
			}
			kind := jInt
			if q+1 < len(src) && src[q] == '.' && src[q+1] >= '0' && src[q+1] <= '9' {
				q++
				for q < len(src) && (src[q] >= '0' && src[q] <= '9' || src[q] == '_') {
					q++
				}
				kind = jFloat
			}
			if q < len(src) && (src[q] == 'e' || src[q] == 'E') {
				r := q + 1
				if r < len(src) && (src[r] == '+' || src[r] == '-') {
					r++
				}
				if r < len(src) && src[r] >= '0' && src[r] <= '9' {
					for r < len(src) && src[r] >= '0' && src[r] <= '9' {
						r++
					}
					q, kind = r, jFloat
				}
			}
			lx.toks = append(lx.toks, jtok{kind: kind, val: strings.ReplaceAll(src[p:q], "_", ""), pos: p})
			p = q
			continue
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			q := p
			for q < len(src) && (src[q] == '_' || src[q] >= 'a' && src[q] <= 'z' || src[q] >= 'A' && src[q] <= 'Z' || src[q] >= '0' && src[q] <= '9') {
				q++
			}
			lx.toks = append(lx.toks, jtok{kind: jName, val: src[p:q], pos: p})
			p = q
			continue
		}
		matched := false
		for _, op := range jOps {
			if strings.HasPrefix(src[p:], op) {
				switch op {
				case "(", "[", "{":
					depth++
				case ")", "]", "}":
					depth--
				}
				lx.toks = append(lx.toks, jtok{kind: jOp, val: op, pos: p})
				p += len(op)
				matched = true
				break
			}
		}
		if !matched {
			return 0, fmt.Errorf("chat template: unexpected character %q at offset %d", c, p)
		}
	}
	return 0, fmt.Errorf("chat template: missing %q", closer)
}

// lexString reads a Python string literal and returns its value and length.
func lexString(s string) (string, int, error) {
	q := s[0]
	var sb strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			return sb.String(), i + 1, nil
		}
		if c != '\\' {
			sb.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			sb.WriteByte('\n')
		case 't':
			sb.WriteByte('\t')
		case 'r':
			sb.WriteByte('\r')
		case '0':
			sb.WriteByte(0)
		case '\\', '\'', '"':
			sb.WriteByte(e)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("bad \\%c escape", e)
			}
			var r rune
			for _, h := range []byte(s[i+1 : i+1+n]) {
				v, ok := hexVal(h)
				if !ok {
					return "", 0, fmt.Errorf("bad \\%c escape", e)
				}
				r = r<<4 | rune(v)
			}
			sb.WriteRune(r)
			i += n
		default:
			// Python keeps unknown escapes as written.
			sb.WriteByte('\\')
			sb.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string")
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
