package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// matcher finds successive non-overlapping matches of a split pattern, the
// way Oniguruma's find_iter does in HuggingFace tokenizers.
type matcher interface {
	// find returns the first match at or after byte offset at, or (-1, -1).
	find(s string, at int) (start, end int)
}

// Known pre-tokenizer regexes, matched by exact pattern text, for which a
// hand-written scanner replaces the general regexp2 engine. Each scanner is
// checked against regexp2 by TestScannersMatchRegexp2 and FuzzScanners.
const (
	patGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// Llama 3 / cl100k.
	patLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// Qwen2 / Qwen3: Llama 3 with single digits.
	patQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// DeepSeek-V3: three successive splits.
	patDSDigits = `\p{N}{1,3}`
	patDSCJK    = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	patDSMain   = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// scanFunc returns the end of the match that starts exactly at i, or -1.
type scanFunc func(s string, i int) int

type scanMatcher struct{ at scanFunc }

func (m scanMatcher) find(s string, at int) (int, int) {
	for i := at; i < len(s); {
		if e := m.at(s, i); e >= 0 {
			return i, e
		}
		_, n := utf8.DecodeRuneInString(s[i:])
		i += n
	}
	return -1, -1
}

// scanners maps the exact pattern text to its scanner.
var scanners = map[string]scanFunc{
	patGPT2:     scanGPT2,
	patLlama3:   scanLlama3,
	patQwen2:    scanQwen2,
	patDSDigits: scanDSDigits,
	patDSCJK:    scanDSCJK,
	patDSMain:   scanDSMain,
}

// defaultMatchTimeout bounds one regexp2 match (one FindRunesMatch or
// FindNextMatch call: the search for the next match and the match itself).
// regexp2 backtracks, so a pattern like (a+)+$ takes time exponential in
// the text. Real patterns take microseconds a match, and the search scans
// text without a match at some 25 million characters a second (the slowest
// of a few patterns timed over 3 MB of Go source), so only a pathological
// pattern, or tens of megabytes without a match, reaches the limit.
const defaultMatchTimeout = time.Second

// compilePattern returns a matcher for a Split / Replace pattern. literal
// patterns are matched as plain strings. where names the component using
// the pattern (such as "pre_tokenizer Split") for the error a regex match
// that runs past opts' time limit raises.
func compilePattern(pattern string, literal bool, where string, opts *buildOptions) (matcher, error) {
	if literal {
		return literalMatcher(pattern), nil
	}
	if opts.scanners {
		if f, ok := scanners[pattern]; ok {
			return scanMatcher{f}, nil
		}
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile regex %q: %w", pattern, err)
	}
	re.MatchTimeout = opts.matchTimeout
	if re.MatchTimeout <= 0 {
		re.MatchTimeout = defaultMatchTimeout
	}
	return &regexMatcher{re: re, pattern: pattern, where: where}, nil
}

type literalMatcher string

func (m literalMatcher) find(s string, at int) (int, int) {
	if m == "" {
		return -1, -1
	}
	i := strings.Index(s[at:], string(m))
	if i < 0 {
		return -1, -1
	}
	return at + i, at + i + len(m)
}

// regexMatcher runs a general regex with regexp2 (backtracking, lookaround,
// Unicode classes). regexp2 indexes runes, so offsets are converted. A match
// that fails (runs past re.MatchTimeout) panics with a *patternError, which
// Encode, Decode and build recover and return (see patternFailure); no
// panic leaves the package.
type regexMatcher struct {
	re      *regexp2.Regexp
	pattern string // as written in tokenizer.json
	where   string // the component using it, such as "pre_tokenizer Split"
}

func (m *regexMatcher) find(s string, at int) (int, int) {
	st, e := -1, -1
	m.each(s[at:], func(a, b int) bool {
		st, e = at+a, at+b
		return false
	})
	return st, e
}

// each calls fn for the successive non-empty matches in s until fn returns
// false. (Split and Replace patterns never need empty matches: find_iter's
// empty matches produce no pieces.) An error from regexp2 panics with a
// *patternError: ending the list of matches there would tokenize wrongly.
func (m *regexMatcher) each(s string, fn func(start, end int) bool) {
	runes := []rune(s)
	offs := make([]int, len(runes)+1)
	o := 0
	for i, r := range runes {
		offs[i] = o
		o += utf8.RuneLen(r)
	}
	offs[len(runes)] = o
	match, err := m.re.FindRunesMatch(runes)
	for {
		if err != nil {
			panic(&patternError{where: m.where, pattern: m.pattern, timeout: m.re.MatchTimeout, err: err})
		}
		if match == nil {
			return
		}
		if match.Length > 0 && !fn(offs[match.Index], offs[match.Index+match.Length]) {
			return
		}
		match, err = m.re.FindNextMatch(match)
	}
}

// patternError is a regex match that failed; regexp2 fails a match only
// when it runs past its MatchTimeout (or on an internal error).
type patternError struct {
	where, pattern string
	timeout        time.Duration
	err            error // regexp2's, which quotes the whole text
}

func (e *patternError) Error() string {
	if strings.HasPrefix(e.err.Error(), "match timeout") {
		return fmt.Sprintf("%s pattern %q: a match ran over %v on this text (the pattern backtracks pathologically)",
			e.where, e.pattern, e.timeout)
	}
	return fmt.Sprintf("%s pattern %q: regexp2: %v", e.where, e.pattern, e.err)
}

func (e *patternError) Unwrap() error { return e.err }

// patternFailure returns the *patternError that r, a value recover
// returned, holds, or nil when r is nil. Any other panic goes on.
func patternFailure(r any) *patternError {
	if r == nil {
		return nil
	}
	pe, ok := r.(*patternError)
	if !ok {
		panic(r)
	}
	return pe
}

// forEachMatch calls fn for each successive non-empty match of m in s.
func forEachMatch(m matcher, s string, fn func(start, end int)) {
	if rm, ok := m.(*regexMatcher); ok {
		rm.each(s, func(a, b int) bool { fn(a, b); return true })
		return
	}
	for at := 0; at < len(s); {
		st, e := m.find(s, at)
		if st < 0 {
			return
		}
		if e > st {
			fn(st, e)
			at = e
		} else {
			_, n := utf8.DecodeRuneInString(s[e:])
			at = e + n
		}
	}
}

// Character classes used by the scanners.
const (
	cL     = 1 << iota // \p{L}
	cN                 // \p{N}
	cSpace             // \s (Unicode White_Space)
	cP                 // \p{P}
	cS                 // \p{S}
	cM                 // \p{M}
	cCRLF              // \r or \n
)

var asciiClass = func() (t [128]uint8) {
	for r := 0; r < 128; r++ {
		t[r] = classSlow(rune(r))
	}
	return t
}()

func classSlow(r rune) uint8 {
	var c uint8
	switch {
	case unicode.IsLetter(r):
		c |= cL
	case unicode.IsNumber(r):
		c |= cN
	case unicode.IsPunct(r):
		c |= cP
	case unicode.IsSymbol(r):
		c |= cS
	case unicode.IsMark(r):
		c |= cM
	}
	if isWhiteSpace(r) {
		c |= cSpace
	}
	if r == '\r' || r == '\n' {
		c |= cCRLF
	}
	return c
}

// isWhiteSpace reports the Unicode White_Space property (Oniguruma's and
// Rust's \s): Go's unicode.IsSpace covers exactly that set.
func isWhiteSpace(r rune) bool { return unicode.IsSpace(r) }

// class decodes the rune at i and returns its class bits and width. At the
// end of s it returns (0, 0).
func class(s string, i int) (uint8, int) {
	if i >= len(s) {
		return 0, 0
	}
	if b := s[i]; b < utf8.RuneSelf {
		return asciiClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classSlow(r), n
}

// run returns the end of the run of characters starting at i whose class
// intersects want.
func run(s string, i int, want uint8) int {
	for i < len(s) {
		c, n := class(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// runMax is run limited to at most max characters.
func runMax(s string, i int, want uint8, max int) int {
	for k := 0; k < max && i < len(s); k++ {
		c, n := class(s, i)
		if c&want == 0 {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d at i, where s[i] is an apostrophe.
// With fold, letters match case-insensitively under Unicode simple case
// folding (so 'ſ' matches 's', as in Oniguruma).
func contraction(s string, i int, fold bool) int {
	j := i + 1
	r, n := utf8.DecodeRuneInString(s[j:])
	if n == 0 {
		return -1
	}
	lower := func(r rune) rune {
		if !fold {
			return r
		}
		switch r {
		case 'S', 'T', 'R', 'E', 'V', 'M', 'L', 'D':
			return r + 'a' - 'A'
		case 'ſ':
			return 's'
		}
		return r
	}
	var want rune
	switch lower(r) {
	case 's', 't', 'm', 'd':
		return j + n
	case 'r', 'v':
		want = 'e'
	case 'l':
		want = 'l'
	default:
		return -1
	}
	r2, n2 := utf8.DecodeRuneInString(s[j+n:])
	if n2 > 0 && lower(r2) == want {
		return j + n + n2
	}
	return -1
}

// spaceTail implements \s+(?!\S)|\s+ at i, where s[i] is white space.
func spaceTail(s string, i int) int {
	e := i
	last := i
	for e < len(s) {
		c, n := class(s, e)
		if c&cSpace == 0 {
			break
		}
		last = e
		e += n
	}
	if e == len(s) || last == i {
		// (?!\S) holds at the end; a single space before \S falls to \s+.
		return e
	}
	return last
}

// crlfTail implements \s*[\r\n]+ at i (s[i] is white space): up to and
// including the last \r or \n of the white-space run, or -1.
func crlfTail(s string, i int) int {
	end := -1
	for e := i; e < len(s); {
		c, n := class(s, e)
		if c&cSpace == 0 {
			break
		}
		if c&cCRLF != 0 {
			end = e + n
		}
		e += n
	}
	return end
}

// spaceAlts implements \s*[\r\n]+|\s+(?!\S)|\s+ at i, or -1 where s[i]
// (of class c0) is not white space.
func spaceAlts(s string, i int, c0 uint8) int {
	if c0&cSpace == 0 {
		return -1
	}
	if e := crlfTail(s, i); e >= 0 {
		return e
	}
	return spaceTail(s, i)
}

func scanGPT2(s string, i int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, false); e >= 0 {
			return e
		}
	}
	// ' ?X+' for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: the optional space is
	// taken only when the next character is an X.
	if s[i] == ' ' && i+1 < len(s) {
		c1, _ := class(s, i+1)
		switch {
		case c1&cL != 0:
			return run(s, i+1, cL)
		case c1&cN != 0:
			return run(s, i+1, cN)
		case c1&cSpace == 0:
			return runOther(s, i+1)
		}
	}
	c0, _ := class(s, i)
	switch {
	case c0&cL != 0:
		return run(s, i, cL)
	case c0&cN != 0:
		return run(s, i, cN)
	case c0&cSpace == 0:
		return runOther(s, i)
	}
	return spaceTail(s, i)
}

// runOther is [^\s\p{L}\p{N}]+ from i.
func runOther(s string, i int) int {
	for i < len(s) {
		c, n := class(s, i)
		if c&(cSpace|cL|cN) != 0 {
			break
		}
		i += n
	}
	return i
}

func scanLlama3(s string, i int) int { return scanCL100k(s, i, 3) }
func scanQwen2(s string, i int) int  { return scanCL100k(s, i, 1) }

func scanCL100k(s string, i int, digits int) int {
	if s[i] == '\'' {
		if e := contraction(s, i, true); e >= 0 {
			return e
		}
	}
	c0, n0 := class(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0&(cCRLF|cL|cN) == 0 {
		if c1, _ := class(s, i+n0); c1&cL != 0 {
			return run(s, i+n0, cL)
		}
	}
	if c0&cL != 0 {
		return run(s, i, cL)
	}
	// \p{N}{1,digits}
	if c0&cN != 0 {
		return runMax(s, i, cN, digits)
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j := -1
	if s[i] == ' ' {
		if c1, _ := class(s, i+1); i+1 < len(s) && c1&(cSpace|cL|cN) == 0 {
			j = i + 1
		}
	} else if c0&(cSpace|cL|cN) == 0 {
		j = i
	}
	if j >= 0 {
		e := runOther(s, j)
		return run(s, e, cCRLF)
	}
	return spaceAlts(s, i, c0)
}

func scanDSDigits(s string, i int) int {
	if c, _ := class(s, i); c&cN != 0 {
		return runMax(s, i, cN, 3)
	}
	return -1
}

func isDSCJK(r rune) bool {
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x309f || r >= 0x30a0 && r <= 0x30ff
}

func scanDSCJK(s string, i int) int {
	e := i
	for e < len(s) {
		r, n := utf8.DecodeRuneInString(s[e:])
		if !isDSCJK(r) {
			break
		}
		e += n
	}
	if e == i {
		return -1
	}
	return e
}

func isASCIIPunct(b byte) bool {
	return b >= '!' && b <= '/' || b >= ':' && b <= '@' || b >= '[' && b <= '`' || b >= '{' && b <= '~'
}

func isASCIILetter(b byte) bool { return b|0x20 >= 'a' && b|0x20 <= 'z' }

func scanDSMain(s string, i int) int {
	// [!"#...~][A-Za-z]+
	if isASCIIPunct(s[i]) && i+1 < len(s) && isASCIILetter(s[i+1]) {
		e := i + 1
		for e < len(s) && isASCIILetter(s[e]) {
			e++
		}
		return e
	}
	c0, n0 := class(s, i)
	// [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
	if c0&(cCRLF|cL|cP|cS) == 0 {
		if c1, _ := class(s, i+n0); c1&(cL|cM) != 0 {
			return run(s, i+n0, cL|cM)
		}
	}
	if c0&(cL|cM) != 0 {
		return run(s, i, cL|cM)
	}
	// ' ?[\p{P}\p{S}]+[\r\n]*'
	j := -1
	if s[i] == ' ' {
		if c1, _ := class(s, i+1); c1&(cP|cS) != 0 {
			j = i + 1
		}
	} else if c0&(cP|cS) != 0 {
		j = i
	}
	if j >= 0 {
		e := run(s, j, cP|cS)
		return run(s, e, cCRLF)
	}
	return spaceAlts(s, i, c0)
}
