package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// byteToChar is GPT-2's reversible map from bytes to printable characters
// (pre_tokenizers::byte_level::bytes_char).
var byteToChar = func() (t [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

// charToByte inverts byteToChar; entries not in the map are -1. All
// byte-level characters are below U+0144.
var charToByte = func() (t [0x144]int16) {
	for i := range t {
		t[i] = -1
	}
	for b, r := range byteToChar {
		t[r] = int16(b)
	}
	return t
}()

func bytesToByteLevel(s string) string {
	var sb strings.Builder
	sb.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToChar[s[i]])
	}
	return sb.String()
}

// byteLevelToBytes maps a string of byte-level characters back to bytes;
// ok is false if some character is not a byte-level character.
func byteLevelToBytes(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 0 || int(r) >= len(charToByte) || charToByte[r] < 0 {
			return nil, false
		}
		out = append(out, byte(charToByte[r]))
	}
	return out, true
}

// appendLossy appends b to dst as valid UTF-8, replacing each maximal
// ill-formed subsequence with U+FFFD, as Rust's String::from_utf8_lossy.
func appendLossy(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			dst = append(dst, b[i:i+n]...)
			i += n
			continue
		}
		// Invalid: skip the maximal prefix of a valid sequence.
		i += maximalSubpart(b[i:])
		dst = append(dst, "\uFFFD"...)
	}
	return dst
}

// maximalSubpart returns the length (>= 1) of the longest prefix of b that
// is a prefix of some well-formed UTF-8 sequence, b[0] not being a valid
// start of a complete sequence.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if x < lo || x > hi {
			break
		}
		lo, hi = 0x80, 0xBF
		n++
	}
	return n
}

// validUTF8 returns s, or a copy with ill-formed sequences replaced by
// U+FFFD the way from_utf8_lossy does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(appendLossy(nil, []byte(s)))
}
