package tokenizer

import (
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// Cache limits, as in HuggingFace tokenizers: words of 256 bytes or more
// are not cached, and at most 10,000 words are kept.
const (
	cacheMaxWordLen  = 256
	cacheMaxEntries  = 10000
	noID             = int32(-1)
	byteFallbackForm = "<0x%02X>"
)

// bpe is a byte-pair-encoding model, equivalent to tokenizers' models::bpe.
type bpe struct {
	vocab        map[string]int32
	vocabR       map[int32]string
	vocabSize    int // number of entries, as get_vocab_size
	merges       map[uint64]uint64
	unk          int32 // noID when absent
	unkToken     string
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix ("" = none)
	suffix       string // end_of_word_suffix ("" = none)
	fallbackIDs  [256]int32

	// byteSym maps a raw byte to the id of its byte-level character, for
	// words handed over by the ByteLevel pre-tokenizer without being mapped.
	byteSym   [256]int32
	byteVocab map[string]int32 // raw-byte form of vocab, built lazily for ignore_merges
	byteOnce  sync.Once

	mu    sync.RWMutex
	cache map[string][]int32
}

func mergeKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func newBPE(vocab map[string]int32, merges [][2]string, unkToken string, hasUnk bool,
	fuseUnk, byteFallback, ignoreMerges bool, prefix, suffix string) (*bpe, error) {
	m := &bpe{
		vocab:        vocab,
		vocabR:       make(map[int32]string, len(vocab)),
		vocabSize:    len(vocab),
		merges:       make(map[uint64]uint64, len(merges)),
		unk:          noID,
		fuseUnk:      fuseUnk,
		byteFallback: byteFallback,
		ignoreMerges: ignoreMerges,
		prefix:       prefix,
		suffix:       suffix,
		cache:        make(map[string][]int32),
	}
	for tok, id := range vocab {
		m.vocabR[id] = tok
	}
	if hasUnk {
		m.unkToken = unkToken
		id, ok := vocab[unkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q is not in model.vocab", unkToken)
		}
		m.unk = id
	}
	for i, pr := range merges {
		a, ok := vocab[pr[0]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", i, pr[0])
		}
		b, ok := vocab[pr[1]]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: token %q is not in model.vocab", i, pr[1])
		}
		right := pr[1]
		if len(prefix) > 0 {
			if len(right) < len(prefix) {
				return nil, fmt.Errorf("model.merges[%d]: token %q is shorter than continuing_subword_prefix", i, right)
			}
			right = right[len(prefix):]
		}
		merged := pr[0] + right
		n, ok := vocab[merged]
		if !ok {
			return nil, fmt.Errorf("model.merges[%d]: merged token %q is not in model.vocab", i, merged)
		}
		// Later duplicates overwrite earlier ones, as HashMap::collect does.
		m.merges[mergeKey(a, b)] = uint64(uint32(i))<<32 | uint64(uint32(n))
	}
	for b := 0; b < 256; b++ {
		m.fallbackIDs[b] = noID
		if id, ok := vocab[fmt.Sprintf(byteFallbackForm, b)]; ok {
			m.fallbackIDs[b] = id
		}
		m.byteSym[b] = noID
		if id, ok := vocab[string(byteToChar[b])]; ok {
			m.byteSym[b] = id
		}
	}
	return m, nil
}

// tokenize appends the ids of word to dst. If rawBytes is set, word holds
// raw bytes that stand for their byte-level characters (ByteLevel
// pre-tokenization without the mapping done).
func (m *bpe) tokenize(dst []int, word string, rawBytes bool) []int {
	if word == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.lookupWhole(word, rawBytes); ok {
			return append(dst, int(id))
		}
	}
	if len(word) < cacheMaxWordLen {
		m.mu.RLock()
		ids, ok := m.cache[word]
		m.mu.RUnlock()
		if ok {
			for _, id := range ids {
				dst = append(dst, int(id))
			}
			return dst
		}
	}
	ids := m.mergeWord(word, rawBytes)
	if len(word) < cacheMaxWordLen {
		m.mu.Lock()
		if len(m.cache) < cacheMaxEntries {
			m.cache[word] = ids
		}
		m.mu.Unlock()
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

func (m *bpe) lookupWhole(word string, rawBytes bool) (int32, bool) {
	if !rawBytes {
		id, ok := m.vocab[word]
		return id, ok
	}
	m.byteOnce.Do(func() {
		m.byteVocab = make(map[string]int32, len(m.vocab))
		for tok, id := range m.vocab {
			if raw, ok := byteLevelToBytes(tok); ok {
				m.byteVocab[string(raw)] = id
			}
		}
	})
	id, ok := m.byteVocab[word]
	return id, ok
}

type symbol struct {
	id         int32
	prev, next int32
	size       int32 // byte length; 0 once merged away
}

// mergeWord is models::bpe::BPE::merge_word followed by Word::merge_all.
func (m *bpe) mergeWord(word string, rawBytes bool) []int32 {
	syms := make([]symbol, 0, len(word))
	add := func(id int32, size int) {
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1, size: int32(size)})
	}
	if rawBytes && m.prefix == "" && m.suffix == "" {
		ok := true
		for i := 0; i < len(word); i++ {
			if m.byteSym[word[i]] == noID {
				ok = false
				break
			}
		}
		if ok {
			for i := 0; i < len(word); i++ {
				add(m.byteSym[word[i]], 1)
			}
		} else {
			word, rawBytes = bytesToByteLevel(word), false
		}
	} else if rawBytes {
		word, rawBytes = bytesToByteLevel(word), false
	}
	if !rawBytes {
		unkID, unkLen := noID, 0
		var sb strings.Builder
		for i := 0; i < len(word); {
			_, n := utf8.DecodeRuneInString(word[i:])
			s := word[i : i+n]
			if (i > 0 && m.prefix != "") || (i+n == len(word) && m.suffix != "") {
				sb.Reset()
				if i > 0 {
					sb.WriteString(m.prefix)
				}
				sb.WriteString(s)
				if i+n == len(word) {
					sb.WriteString(m.suffix)
				}
				s = sb.String()
			}
			if id, ok := m.vocab[s]; ok {
				if unkID != noID {
					add(unkID, unkLen)
					unkID = noID
				}
				add(id, n)
			} else if m.byteFallback && m.allFallback(s) {
				for k := 0; k < len(s); k++ {
					add(m.fallbackIDs[s[k]], 1)
				}
			} else if m.unk != noID {
				if unkID != noID && m.fuseUnk {
					unkLen += n
				} else {
					if unkID != noID {
						add(unkID, unkLen)
					}
					unkID, unkLen = m.unk, n
				}
			}
			i += n
		}
		if unkID != noID {
			add(unkID, unkLen)
		}
	}
	if len(syms) == 0 {
		return nil
	}
	syms[len(syms)-1].next = -1
	if len(syms) > 1 {
		m.mergeAll(syms)
	}
	out := make([]int32, 0, len(syms))
	for i := int32(0); i >= 0 && int(i) < len(syms); i = syms[i].next {
		out = append(out, syms[i].id)
	}
	return out
}

func (m *bpe) allFallback(s string) bool {
	for k := 0; k < len(s); k++ {
		if m.fallbackIDs[s[k]] == noID {
			return false
		}
	}
	return true
}

// mergeItem is a candidate merge: lowest rank first, then leftmost.
type mergeItem struct {
	rank, pos, newID int32
}

func (a mergeItem) less(b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

type mergeHeap []mergeItem

func (h *mergeHeap) push(x mergeItem) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && s[r].less(s[l]) {
			c = r
		}
		if !s[c].less(s[i]) {
			break
		}
		s[i], s[c] = s[c], s[i]
		i = c
	}
	*h = s
	return top
}

func (m *bpe) lookupMerge(a, b int32) (rank, newID int32, ok bool) {
	v, ok := m.merges[mergeKey(a, b)]
	return int32(v >> 32), int32(uint32(v)), ok
}

// mergeAll applies merges in rank order, as Word::merge_all without dropout.
func (m *bpe) mergeAll(syms []symbol) {
	h := make(mergeHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if r, n, ok := m.lookupMerge(syms[i].id, syms[i+1].id); ok {
			h.push(mergeItem{rank: r, pos: int32(i), newID: n})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next == -1 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if _, n, ok := m.lookupMerge(cur.id, right.id); !ok || n != top.newID {
			continue
		}
		cur.id = top.newID
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, n, ok := m.lookupMerge(syms[cur.prev].id, cur.id); ok {
				h.push(mergeItem{rank: r, pos: cur.prev, newID: n})
			}
		}
		if cur.next >= 0 {
			if r, n, ok := m.lookupMerge(cur.id, syms[cur.next].id); ok {
				h.push(mergeItem{rank: r, pos: top.pos, newID: n})
			}
		}
	}
}
