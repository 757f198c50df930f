package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is an entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// trie is a byte trie for leftmost-longest matching of added tokens.
type trie struct {
	root  [256]int32 // child of the root per byte, 0 = none
	nodes []trieNode // nodes[0] is the root
}

type trieNode struct {
	next map[byte]int32
	id   int32 // token id ending here, or -1
}

func newTrie() *trie { return &trie{nodes: []trieNode{{id: -1}}} }

func (t *trie) insert(s string, id int) {
	cur := int32(0)
	for i := 0; i < len(s); i++ {
		b := s[i]
		var nx int32
		if cur == 0 {
			nx = t.root[b]
		} else {
			nx = t.nodes[cur].next[b]
		}
		if nx == 0 {
			t.nodes = append(t.nodes, trieNode{id: -1})
			nx = int32(len(t.nodes) - 1)
			if cur == 0 {
				t.root[b] = nx
			} else {
				if t.nodes[cur].next == nil {
					t.nodes[cur].next = make(map[byte]int32)
				}
				t.nodes[cur].next[b] = nx
			}
		}
		cur = nx
	}
	t.nodes[cur].id = int32(id)
}

// find returns the leftmost-longest match at or after at.
func (t *trie) find(s string, at int) (start, end, id int) {
	for i := at; i < len(s); i++ {
		cur := t.root[s[i]]
		if cur == 0 {
			continue
		}
		bestEnd, bestID := -1, -1
		for j := i + 1; ; j++ {
			if nd := t.nodes[cur]; nd.id >= 0 {
				bestEnd, bestID = j, int(nd.id)
			}
			if j >= len(s) {
				break
			}
			nx, ok := t.nodes[cur].next[s[j]]
			if !ok {
				break
			}
			cur = nx
		}
		if bestID >= 0 {
			return i, bestEnd, bestID
		}
	}
	return -1, -1, -1
}

// addedVocab is tokenizers' AddedVocabulary.
type addedVocab struct {
	byContent map[string]int
	byID      map[int]addedToken
	normCache map[int]string // normalized content where it differs
	special   map[string]bool
	raw       *trie // tokens matched on the raw input (normalized=false)
	norm      *trie // tokens matched on normalized text
}

// add registers tokens the way AddedVocabulary::add_tokens does when a
// tokenizer.json is loaded: a token already known (added or in the model)
// keeps that id, others get the next free id.
func (a *addedVocab) add(tokens []addedToken, model *bpe, n normalizer) {
	a.byContent = make(map[string]int)
	a.byID = make(map[int]addedToken)
	a.normCache = make(map[int]string)
	a.special = make(map[string]bool)
	modelSize := model.vocabSize
	nextID := modelSize
	for _, tok := range tokens {
		if tok.Content == "" {
			continue
		}
		if id, ok := a.byContent[tok.Content]; ok {
			if cur := a.byID[id]; sameFlags(cur, tok) {
				continue
			}
		}
		var id int
		if x, ok := a.byContent[tok.Content]; ok {
			id = x
		} else if x, ok := model.vocab[tok.Content]; ok {
			id = int(x)
		} else {
			id = nextID
			nextID++
		}
		if tok.Normalized && n != nil {
			if normed := n.normalize(tok.Content); normed != tok.Content {
				a.normCache[id] = normed
			}
		}
		a.byContent[tok.Content] = id
		if tok.Special {
			a.special[tok.Content] = true
		}
		tok.ID = id
		a.byID[id] = tok
	}
	for id, tok := range a.byID {
		if tok.Normalized {
			if a.norm == nil {
				a.norm = newTrie()
			}
			pat := tok.Content
			if c, ok := a.normCache[id]; ok {
				pat = c
			}
			a.norm.insert(pat, id)
		} else {
			if a.raw == nil {
				a.raw = newTrie()
			}
			a.raw.insert(tok.Content, id)
		}
	}
}

func sameFlags(a, b addedToken) bool {
	a.ID, b.ID = 0, 0
	return a == b
}

// isWordChar is the regex crate's Unicode \w.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.IsDigit(r) ||
		unicode.Is(unicode.Pc, r) || r == 0x200C || r == 0x200D || unicode.Is(unicode.Nl, r)
}

// splitAdded is AddedVocabulary::split_with_indices over p: it appends the
// text pieces and the added-token pieces found by t.
func (a *addedVocab) splitAdded(dst []piece, p piece, t *trie) []piece {
	s := p.s
	if t == nil || s == "" {
		if s != "" {
			dst = append(dst, p)
		}
		return dst
	}
	emit := func(x, y, id int) {
		if x < y {
			dst = append(dst, piece{s: s[x:y], id: id, start: p.start && x == 0})
		}
	}
	startOffset := 0
	for at := 0; at < len(s); {
		st, e, id := t.find(s, at)
		if st < 0 {
			break
		}
		at = e
		tok := a.byID[id]
		if tok.SingleWord {
			startSpace := st == 0
			if !startSpace {
				r, _ := utf8.DecodeLastRuneInString(s[:st])
				startSpace = !isWordChar(r)
			}
			stopSpace := e == len(s)
			if !stopSpace {
				r, _ := utf8.DecodeRuneInString(s[e:])
				stopSpace = !isWordChar(r)
			}
			if !startSpace || !stopSpace {
				continue
			}
		}
		if tok.LStrip {
			ns := len(strings.TrimRightFunc(s[:st], isWhiteSpace))
			if ns < startOffset {
				ns = startOffset
			}
			st = ns
		}
		if tok.RStrip {
			e = len(s) - len(strings.TrimLeftFunc(s[e:], isWhiteSpace))
		}
		if startOffset < st {
			emit(startOffset, st, -1)
		}
		emit(st, e, id)
		startOffset = e
	}
	if startOffset < len(s) {
		emit(startOffset, len(s), -1)
	}
	return dst
}
