package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestStopText(t *testing.T) {
	for _, c := range []struct {
		stops  []string
		pieces []string
		last   bool   // the last piece ends generation
		out    string // streamed, piece outputs joined by |
		stop   bool
	}{
		{[]string{"END"}, []string{"ab", "cd"}, false, "ab|cd", false},
		{[]string{"END"}, []string{"abE", "N", "D!"}, false, "ab||", true},
		{[]string{"END"}, []string{"abE", "Nx", "y"}, false, "ab|ENx|y", false},
		{[]string{"END"}, []string{"abEN"}, true, "abEN", false},         // held text flushed at the end
		{[]string{"END"}, []string{"xENDyEND"}, false, "x", true},        // the first occurrence
		{[]string{"ab", "b"}, []string{"xa", "b"}, false, "x|", true},    // "b" completes first, "ab" starts earlier
		{[]string{"bc", "abcd"}, []string{"xabc"}, false, "xa", true},    // the earliest start wins
		{[]string{"\n\n"}, []string{"a\n", "\n"}, false, "a|", true},     // across pieces
		{[]string{"héllo"}, []string{"h", "é", "l"}, false, "||", false}, // held while it may still match
		{[]string{"héllo"}, []string{"h", "é", "x"}, false, "||héx", false},
	} {
		st := stopText{stops: c.stops}
		var outs []string
		stopped := false
		for i, p := range c.pieces {
			o, s := st.add(p, c.last && i == len(c.pieces)-1)
			outs = append(outs, o)
			if s {
				stopped = true
				break
			}
		}
		if got := strings.Join(outs, "|"); got != c.out || stopped != c.stop {
			t.Errorf("stops %q, pieces %q: streamed %q, stopped %v; want %q, %v", c.stops, c.pieces, got, stopped, c.out, c.stop)
		}
	}
}

// TestStopStrings generates greedily with a tokenizer whose every token is
// two letters, then again with a stop string taken from that text across a
// token boundary: the second run streams the text before the stop string's
// first occurrence, ends with StopString, and keeps the tokens up to the one
// that completed it. A stop string that never occurs changes nothing, text
// held back at the end included.
func TestStopStrings(t *testing.T) {
	m := tinyTextModel(t, 9, func(i int) string { return fmt.Sprintf("%c%c", 'a'+i/8, 'a'+i%8) }, `{"type":"Fuse"}`)
	gen := func(stops []string, max int) (*Result, string) {
		t.Helper()
		s, err := m.NewSession(64)
		if err != nil {
			t.Fatal(err)
		}
		var streamed strings.Builder
		res, err := s.Generate(context.Background(), []int{1, 2, 3}, GenerateOptions{MaxTokens: max, StopTokens: []int{}, StopStrings: stops},
			func(tk Token) error { streamed.WriteString(tk.Text); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return res, streamed.String()
	}
	const max = 12
	base, full := gen(nil, max)
	if len(full) != 2*max {
		t.Fatalf("text %q: want two letters a token", full)
	}
	stop := full[5:8] // bytes of tokens 2, 3
	cut := strings.Index(full, stop)
	res, got := gen([]string{stop}, max)
	wantTokens := base.Tokens[:(cut+len(stop)-1)/2+1]
	if got != full[:cut] || res.Reason != StopString || !slices.Equal(res.Tokens, wantTokens) {
		t.Errorf("stop %q in %q: streamed %q, %s, tokens %v; want %q, %s, %v", stop, full, got, res.Reason, res.Tokens, full[:cut], StopString, wantTokens)
	}
	// Never complete, but its first letter ends the text: held, then flushed.
	last := full[len(full)-1:]
	res, got = gen([]string{last + "zz"}, max)
	if got != full || res.Reason != StopMaxTokens || !slices.Equal(res.Tokens, base.Tokens) {
		t.Errorf("absent stop string: streamed %q, %s; want %q, %s", got, res.Reason, full, StopMaxTokens)
	}
	s, _ := m.NewSession(64)
	if _, err := s.Generate(context.Background(), []int{1}, GenerateOptions{StopStrings: []string{"a", ""}}, nil); err == nil || !strings.Contains(err.Error(), "StopStrings[1]") {
		t.Errorf("empty stop string: %v", err)
	}
	g, _ := loadGolden(t, "llama")
	gs, _ := g.NewSession(16)
	if _, err := gs.Generate(context.Background(), []int{1}, GenerateOptions{StopStrings: []string{"x"}}, nil); !errors.Is(err, ErrNoTokenizer) {
		t.Errorf("stop strings without a tokenizer: %v", err)
	}
}
