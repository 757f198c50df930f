package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// maxPendingTokens bounds how many tokens a StreamDecoder holds back while
// the decoded text ends in an incomplete character: a UTF-8 character has
// at most 4 bytes, so after that many tokens the U+FFFD is real.
const maxPendingTokens = 4

// StreamDecoder decodes ids one at a time for token-by-token output. It
// emits text only once the decoded text ends at a complete UTF-8 character,
// and it decodes each step together with the previous tokens so decoders
// that treat the first token specially (Metaspace, Strip) give the same
// text as decoding everything at once. Not safe for concurrent use.
type StreamDecoder struct {
	t           *Tokenizer
	skipSpecial bool
	ids         []int  // context ids followed by pending ids
	prefix      string // decoding of ids[:prefixIdx], already emitted
	prefixIdx   int
	badFrom     int // 1 + index in ids of the token that began a U+FFFD tail; 0 if none
}

// PrimeTokens is how many ids of context StreamDecoder.Prime keeps.
const PrimeTokens = 4

// NewStreamDecoder returns a decoder that keeps special tokens.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder { return &StreamDecoder{t: t} }

// NewStreamDecoderSkipSpecial returns a decoder that drops special tokens.
func (t *Tokenizer) NewStreamDecoderSkipSpecial() *StreamDecoder {
	return &StreamDecoder{t: t, skipSpecial: true}
}

// Prime gives the decoder the ids that come before the ones it will be fed
// (the end of a prompt), as context only: their text is not returned. A
// decoder that treats the first token of a text specially (SentencePiece's
// Metaspace or Strip drop its leading space) then decodes the first fed id
// as it stands after them, as a decode of the whole sequence would. Only
// the last few ids matter; Prime keeps at most PrimeTokens.
func (d *StreamDecoder) Prime(ids []int) (err error) {
	defer d.catchPattern(&err)
	d.reset()
	d.ids = append(d.ids, ids[max(0, len(ids)-PrimeTokens):]...)
	d.prefixIdx = len(d.ids)
	d.prefix = d.t.decode(d.ids, d.skipSpecial)
	return nil
}

// Add feeds one id and returns the new text, or "" while the text so far
// ends inside a character. It fails only as Decode does; the decoder is
// then reset, and the text it held back is lost.
func (d *StreamDecoder) Add(id int) (text string, err error) {
	defer d.catchPattern(&err)
	return d.add(id), nil
}

// Flush returns any held-back text (with U+FFFD for incomplete
// characters) and resets the decoder. It fails only as Decode does.
func (d *StreamDecoder) Flush() (text string, err error) {
	defer d.catchPattern(&err)
	return d.flush(), nil
}

// catchPattern, deferred, recovers a regex match's failure below it into
// *err and resets the decoder.
func (d *StreamDecoder) catchPattern(err *error) {
	if pe := patternFailure(recover()); pe != nil {
		d.reset()
		*err = d.t.patternError(pe)
	}
}

func (d *StreamDecoder) reset() {
	d.ids, d.prefix, d.prefixIdx, d.badFrom = d.ids[:0], "", 0, 0
}

func (d *StreamDecoder) add(id int) string {
	d.ids = append(d.ids, id)
	s := d.t.decode(d.ids, d.skipSpecial)
	if strings.HasSuffix(s, "\uFFFD") {
		if d.badFrom == 0 {
			d.badFrom = len(d.ids)
		}
		if len(d.ids)-d.badFrom+1 < maxPendingTokens {
			return ""
		}
	} else {
		d.badFrom = 0
	}
	if len(s) <= len(d.prefix) {
		return ""
	}
	d.badFrom = 0
	var out string
	if strings.HasPrefix(s, d.prefix) {
		out = s[len(d.prefix):]
	} else {
		// The new bytes changed how earlier text decodes (an invalid
		// sequence turned out not to complete); emit the pending tokens'
		// own decoding rather than repeat text.
		out = d.t.decode(d.ids[d.prefixIdx:], d.skipSpecial)
	}
	// Keep the tokens just emitted as context for the next step.
	d.ids = append(d.ids[:0], d.ids[d.prefixIdx:]...)
	d.prefixIdx = len(d.ids)
	d.prefix = d.t.decode(d.ids, d.skipSpecial)
	return out
}

func (d *StreamDecoder) flush() string {
	var out string
	if len(d.ids) > d.prefixIdx {
		s := d.t.decode(d.ids, d.skipSpecial)
		if strings.HasPrefix(s, d.prefix) {
			out = s[len(d.prefix):]
		} else {
			out = d.t.decode(d.ids[d.prefixIdx:], d.skipSpecial)
		}
	}
	d.reset()
	if !utf8.ValidString(out) {
		out = validUTF8(out)
	}
	return out
}
