package engine

import "strings"

// stopText finds stop strings in generated text as it is streamed. Text that
// could be the start of a stop string is held back until the next piece
// shows whether it is, so that no streamed text is ever part of a stop
// string.
type stopText struct {
	stops []string
	held  string // text not streamed yet
}

// add appends the next piece of generated text and returns the text that can
// be streamed now. When a stop string is complete, it returns the text before
// its first occurrence and stopped; when last is set (generation ends with
// this piece for another reason), all text held back.
func (st *stopText) add(piece string, last bool) (out string, stopped bool) {
	st.held += piece
	if i := st.first(); i >= 0 {
		out, st.held = st.held[:i], ""
		return out, true
	}
	keep := len(st.held)
	if !last {
		keep -= st.partial()
	}
	out, st.held = st.held[:keep], st.held[keep:]
	return out, false
}

// first is the index in held of the earliest stop string, or -1.
func (st *stopText) first() int {
	at := -1
	for _, s := range st.stops {
		if i := strings.Index(st.held, s); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// partial is the length of the longest end of held that begins some stop
// string without completing it.
func (st *stopText) partial() int {
	n := 0
	for _, s := range st.stops {
		for k := min(len(st.held), len(s)-1); k > n; k-- {
			if strings.HasSuffix(st.held, s[:k]) {
				n = k
				break
			}
		}
	}
	return n
}
