package engine

import (
	"fmt"
	"math"
	"math/bits"
	"runtime"
	"slices"
	"sync"
)

// Constraint restricts the tokens a generation may pick (constrained
// output): before each pick Mask sets the logits of the tokens it forbids to
// -Inf, and Accept tells it the token picked. A Constraint belongs to one
// Generate call. With a Constraint the engine picks on the host.
type Constraint interface {
	Mask(logits []float32)
	Accept(id int)
}

// NewJSONConstraint returns a Constraint under which a generation writes one
// JSON object (OpenAI's response_format "json_object"): each token must
// extend a prefix of valid JSON whose top-level value is an object, and once
// the object closes only a token of stops (the model's EOS tokens when nil)
// may follow, so generation ends there. Whitespace between tokens is
// allowed, at most maxJSONSpaces bytes of it in a row, so that a model
// cannot pad forever. The model needs a tokenizer.
func (m *Model) NewJSONConstraint(stops []int) (Constraint, error) {
	if m.tok == nil {
		return nil, fmt.Errorf("engine: JSON constraint: %w", ErrNoTokenizer)
	}
	if stops == nil {
		stops = m.EOSTokens()
	}
	return &jsonConstraint{masks: m.jsonMasks(), stops: stops}, nil
}

// jsonMasks returns the model's cache of JSON masks, made once.
func (m *Model) jsonMasks() *jsonMasks {
	m.tokBytesOnce.Do(func() {
		t := make([][]byte, m.cfg.VocabSize)
		for id := range min(m.tok.VocabSize(), len(t)) {
			if s, err := m.tok.Decode([]int{id}, true); err == nil {
				t[id] = []byte(s)
			}
		}
		m.masks = &jsonMasks{toks: t, byState: map[string][]uint64{}}
	})
	return m.masks
}

// jsonMasks caches, for each recognizer state met, the set of tokens that
// extend it (a bit a token), so that a step whose state was seen before
// (inside a string, between values at the same depth) costs one pass over
// the bits instead of one over every token's bytes. Shared by the
// generations of a model; at most maxJSONMasks states are kept.
type jsonMasks struct {
	toks    [][]byte // each token's text alone (special tokens: none)
	byFirst sync.Once
	order   []int32    // the token ids with text, grouped by their first byte
	starts  [257]int32 // order[starts[c]:starts[c+1]]: the tokens whose text starts with byte c
	text    []byte     // their texts but the first byte, one after another in order's order
	ends    []int32    // order[i]'s text ends at text[ends[i]] (starts at ends[i-1])
	mu      sync.Mutex
	byState map[string][]uint64
	schemas map[string]*jsonSchema // compiled, by their text (so that their masks are shared)
}

// schema returns raw compiled, once per text (at most maxJSONMasks kept).
func (j *jsonMasks) schema(raw []byte) (*jsonSchema, error) {
	j.mu.Lock()
	sch, ok := j.schemas[string(raw)]
	j.mu.Unlock()
	if ok {
		return sch, nil
	}
	sch, err := compileSchema(raw)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	j.mu.Lock()
	if j.schemas == nil || len(j.schemas) >= maxJSONMasks {
		j.schemas = map[string]*jsonSchema{}
	}
	j.schemas[string(raw)] = sch
	j.mu.Unlock()
	return sch, nil
}

const maxJSONMasks = 1024

// of returns the bit set of the tokens that extend st. A new state tries
// every token, grouped by first byte: the group of a byte st does not take
// is skipped whole (most of them, outside strings), and the tokens of the
// groups it takes are fed from the state after that byte, split over the
// processors.
func (j *jsonMasks) of(st *jsonState) []uint64 {
	key := st.cacheKey()
	j.mu.Lock()
	bits, ok := j.byState[key]
	j.mu.Unlock()
	if ok {
		return bits
	}
	j.byFirst.Do(j.group)
	// The groups st takes, with the state after their first byte.
	type group struct {
		lo, hi int32
		after  jsonState
	}
	var live []group
	n := 0
	for c := range 256 {
		lo, hi := j.starts[c], j.starts[c+1]
		if lo == hi {
			continue
		}
		s := *st
		if s.feed(byte(c)) {
			live = append(live, group{lo, hi, s})
			n += int(hi - lo)
		}
	}
	words := (len(j.toks) + 63) / 64
	// try sets the bits of the live tokens [from, to) of the concatenated
	// groups in out.
	try := func(out []uint64, from, to int) {
		at := 0
		for g := range live {
			size := int(live[g].hi - live[g].lo)
			lo, hi := max(from-at, 0), min(to-at, size)
			at += size
			if lo >= hi {
				continue
			}
			for i := int(live[g].lo) + lo; i < int(live[g].lo)+hi; i++ {
				id, from := j.order[i], int32(0)
				if i > 0 {
					from = j.ends[i-1]
				}
				s := live[g].after
				ok := true
				for _, ch := range j.text[from:j.ends[i]] {
					if ok = s.feed(ch); !ok {
						break
					}
				}
				if ok {
					out[id/64] |= 1 << (id % 64)
				}
			}
		}
	}
	workers := min(runtime.GOMAXPROCS(0), 8, max(n/8192, 1))
	bits = make([]uint64, words)
	if workers == 1 {
		try(bits, 0, n)
	} else {
		parts := make([][]uint64, workers)
		var wg sync.WaitGroup
		for w := range workers {
			parts[w] = make([]uint64, words)
			wg.Go(func() { try(parts[w], w*n/workers, (w+1)*n/workers) })
		}
		wg.Wait()
		for _, p := range parts {
			for i, x := range p {
				bits[i] |= x
			}
		}
	}
	j.mu.Lock()
	if len(j.byState) >= maxJSONMasks {
		clear(j.byState)
	}
	j.byState[key] = bits
	j.mu.Unlock()
	return bits
}

// group fills order, starts, text and ends: the tokens with text, by first
// byte (a counting sort), their texts laid out in that order so that a new
// state's pass reads them in sequence.
func (j *jsonMasks) group() {
	var count [257]int32
	for _, b := range j.toks {
		if len(b) > 0 {
			count[int(b[0])+1]++
		}
	}
	for c := range 256 {
		count[c+1] += count[c]
	}
	j.starts = count
	j.order = make([]int32, count[256])
	next := count
	for id, b := range j.toks {
		if len(b) > 0 {
			j.order[next[b[0]]] = int32(id)
			next[b[0]]++
		}
	}
	j.ends = make([]int32, len(j.order))
	for i, id := range j.order {
		j.text = append(j.text, j.toks[id][1:]...)
		j.ends[i] = int32(len(j.text))
	}
}

// tokenBytesState is the Model's lazily built JSON mask cache.
type tokenBytesState struct {
	tokBytesOnce sync.Once
	masks        *jsonMasks
}

type jsonConstraint struct {
	masks *jsonMasks
	stops []int
	st    jsonState
}

func (c *jsonConstraint) Mask(logits []float32) {
	inf := float32(math.Inf(-1))
	done := c.st.done()
	var allowed []uint64
	if !done {
		allowed = c.masks.of(&c.st)
	}
	keep := make([]float32, len(c.stops))
	for i, id := range c.stops {
		if id >= 0 && id < len(logits) {
			keep[i] = logits[id]
		}
	}
	for w := 0; w*64 < len(logits); w++ {
		var word uint64
		if w < len(allowed) {
			word = allowed[w]
		}
		if word == ^uint64(0) {
			continue
		}
		row := logits[w*64 : min(len(logits), w*64+64)]
		if word == 0 {
			for i := range row {
				row[i] = inf
			}
			continue
		}
		// Only the forbidden tokens of the word: few inside a string.
		for z := ^word; z != 0; z &= z - 1 {
			if i := bits.TrailingZeros64(z); i < len(row) {
				row[i] = inf
			}
		}
	}
	for i, id := range c.stops { // a stop ends the object, and only it
		if id >= 0 && id < len(logits) {
			logits[id] = inf
			if done {
				logits[id] = keep[i]
			}
		}
	}
}

func (c *jsonConstraint) Accept(id int) {
	if id < len(c.masks.toks) && !slices.Contains(c.stops, id) {
		for _, ch := range c.masks.toks[id] {
			c.st.feed(ch)
		}
	}
}

// maxJSONDepth bounds the nesting of a constrained object; maxJSONSpaces the
// whitespace in a row.
const (
	maxJSONDepth  = 64
	maxJSONSpaces = 16
)

// jsonMode is what a jsonState expects next.
type jsonMode uint8

const (
	jValue      jsonMode = iota // a value (at the top: an object)
	jKeyOrClose                 // after '{': a key or '}'
	jKey                        // after ',' in an object: a key
	jColon                      // after a key
	jValueOrEnd                 // after '[': a value or ']'
	jAfter                      // after a value: ',' or the container's close
	jString                     // inside a string
	jEscape                     // after '\' in a string
	jUnicode                    // inside \uXXXX (hex digits left: hex)
	jNumber                     // inside a number (num: its part)
	jLiteral                    // inside true, false or null (lit: the rest)
	jDone                       // the top-level object closed
)

// Number parts.
const (
	nSign    = iota // after '-'
	nZero           // a leading 0
	nInt            // integer digits
	nDot            // after '.'
	nFrac           // fraction digits
	nExp            // after 'e'
	nExpSign        // after the exponent's sign
	nExpInt         // exponent digits
)

// jsonState is a byte-level recognizer of JSON prefixes; a value (copied
// by assignment) so that a token can be tried on a copy.
type jsonState struct {
	mode    jsonMode
	key     bool // the string is an object key
	hex     uint8
	num     uint8
	lit     string
	litThen jsonMode // the mode after the literal
	spaces  uint8
	depth   uint8
	stack   [maxJSONDepth]byte // '{' or '['
	// With a schema: each container's node and its next property (or
	// element count), the node of the scalar being written, and for an
	// enum the options still possible and the bytes of it written.
	sch     *jsonSchema
	frames  [maxJSONDepth]schemaFrame
	scalar  uint16
	enum    uint64
	enumPos uint8
}

type schemaFrame struct{ node, idx uint16 }

func (s *jsonState) done() bool { return s.mode == jDone }

// cacheKey identifies s in the mask cache.
func (s *jsonState) cacheKey() string {
	k := append([]byte{byte(s.mode), b2i(s.key), s.hex, s.num, s.spaces, s.depth, byte(s.litThen)}, s.stack[:s.depth]...)
	if s.sch != nil {
		k = fmt.Appendf(k, "|%d|%d|%d|%d|%v", s.sch.id, s.scalar, s.enum, s.enumPos, s.frames[:s.depth])
	}
	return string(k) + s.lit
}

func b2i(b bool) byte {
	if b {
		return 1
	}
	return 0
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// feed advances by c and reports whether the text is still a JSON prefix.
func (s *jsonState) feed(c byte) bool {
	switch s.mode {
	case jString:
		if s.enum != 0 {
			return s.enumByte(c)
		}
		switch {
		case c == '"':
			s.endString()
		case c == '\\':
			s.mode = jEscape
		case c < 0x20:
			return false
		}
		return true
	case jEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.mode = jString
		case 'u':
			s.mode, s.hex = jUnicode, 4
		default:
			return false
		}
		return true
	case jUnicode:
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
		if s.hex--; s.hex == 0 {
			s.mode = jString
		}
		return true
	case jLiteral:
		if c != s.lit[0] {
			return false
		}
		if s.lit = s.lit[1:]; s.lit == "" {
			s.mode = s.litThen
		}
		return true
	case jNumber:
		if s.number(c) {
			return true
		}
		if s.num == nSign || s.num == nDot || s.num == nExp || s.num == nExpSign {
			return false // a number cannot end here
		}
		s.mode = jAfter
	}
	if isSpace(c) {
		if s.mode == jDone || s.spaces == maxJSONSpaces {
			return false
		}
		s.spaces++
		return true
	}
	s.spaces = 0
	switch s.mode {
	case jValue, jValueOrEnd:
		if s.mode == jValueOrEnd && c == ']' {
			return s.close('[')
		}
		return s.value(c)
	case jKeyOrClose, jKey:
		if s.mode == jKeyOrClose && c == '}' {
			return s.close('{')
		}
		if c != '"' {
			return false
		}
		if s.sch != nil { // the next property's name, in the schema's order
			f := s.frames[s.depth-1]
			props := s.sch.nodes[f.node].props
			if int(f.idx) >= len(props) {
				return false
			}
			s.mode, s.lit, s.litThen = jLiteral, props[f.idx].key+`"`, jColon
			return true
		}
		s.mode, s.key = jString, true
		return true
	case jColon:
		if c != ':' {
			return false
		}
		s.mode = jValue
		return true
	case jAfter:
		top := s.stack[s.depth-1]
		switch {
		case c == ',' && top == '{':
			s.mode = jKey
			if s.sch != nil {
				f := &s.frames[s.depth-1]
				if int(f.idx)+1 >= len(s.sch.nodes[f.node].props) {
					return false // no property left
				}
				f.idx++
			}
		case c == ',' && top == '[':
			s.mode = jValue
			if s.sch != nil {
				s.frames[s.depth-1].idx++
			}
		case c == '}' || c == ']':
			return s.close(map[byte]byte{'}': '{', ']': '['}[c])
		default:
			return false
		}
		return true
	}
	return false
}

// value starts a value with c.
func (s *jsonState) value(c byte) bool {
	if s.depth == 0 && c != '{' {
		return false // the top-level value is an object
	}
	var node uint16
	if s.sch != nil {
		node = s.sch.child(s.depth, s.frames[:s.depth])
		if !s.sch.nodes[node].starts(c) {
			return false
		}
		s.scalar = node
		if c == '"' && len(s.sch.nodes[node].enum) > 0 {
			s.mode, s.key, s.enum, s.enumPos = jString, false, 1<<len(s.sch.nodes[node].enum)-1, 0
			return true
		}
	}
	switch {
	case c == '{' || c == '[':
		if int(s.depth) == maxJSONDepth {
			return false
		}
		s.stack[s.depth] = c
		s.frames[s.depth] = schemaFrame{node: node}
		s.depth++
		s.mode = jKeyOrClose
		if c == '[' {
			s.mode = jValueOrEnd
		}
	case c == '"':
		s.mode, s.key = jString, false
	case c == '-':
		s.mode, s.num = jNumber, nSign
	case c == '0':
		s.mode, s.num = jNumber, nZero
	case c >= '1' && c <= '9':
		s.mode, s.num = jNumber, nInt
	case c == 't':
		s.mode, s.lit, s.litThen = jLiteral, "rue", jAfter
	case c == 'f':
		s.mode, s.lit, s.litThen = jLiteral, "alse", jAfter
	case c == 'n':
		s.mode, s.lit, s.litThen = jLiteral, "ull", jAfter
	default:
		return false
	}
	return true
}

// number advances a number by c, reporting false when c does not continue it.
func (s *jsonState) number(c byte) bool {
	digit := c >= '0' && c <= '9'
	if s.sch != nil && s.sch.nodes[s.scalar].kind == "integer" && (c == '.' || c == 'e' || c == 'E') {
		return false
	}
	switch {
	case digit && s.num == nSign && c == '0':
		s.num = nZero
	case digit && (s.num == nSign || s.num == nInt):
		s.num = nInt
	case digit && (s.num == nDot || s.num == nFrac):
		s.num = nFrac
	case digit && (s.num == nExp || s.num == nExpSign || s.num == nExpInt):
		s.num = nExpInt
	case c == '.' && (s.num == nZero || s.num == nInt):
		s.num = nDot
	case (c == 'e' || c == 'E') && (s.num == nZero || s.num == nInt || s.num == nFrac):
		s.num = nExp
	case (c == '+' || c == '-') && s.num == nExp:
		s.num = nExpSign
	default:
		return false
	}
	return true
}

func (s *jsonState) endString() {
	if s.key {
		s.mode = jColon
	} else {
		s.mode = jAfter
	}
}

// close ends the innermost container, which must be open.
func (s *jsonState) close(open byte) bool {
	if s.depth == 0 || s.stack[s.depth-1] != open {
		return false
	}
	if s.sch != nil && open == '{' {
		f := s.frames[s.depth-1]
		n := len(s.sch.nodes[f.node].props)
		if n > 0 && (s.mode == jKeyOrClose || int(f.idx) != n-1) {
			return false // every property, in order (strict)
		}
	}
	s.depth--
	s.mode = jAfter
	if s.depth == 0 {
		s.mode = jDone
	}
	return true
}

// enumByte advances a string value that must be one of its node's enum
// options (none holds '"' or '\\').
func (s *jsonState) enumByte(c byte) bool {
	opts := s.sch.nodes[s.scalar].enum
	var left uint64
	for i, o := range opts {
		if s.enum&(1<<i) == 0 {
			continue
		}
		if int(s.enumPos) < len(o) && o[s.enumPos] == c || int(s.enumPos) == len(o) && c == '"' {
			left |= 1 << i
		}
	}
	if left == 0 {
		return false
	}
	if c == '"' {
		s.enum, s.mode = 0, jAfter
		return true
	}
	s.enum, s.enumPos = left, s.enumPos+1
	return true
}
