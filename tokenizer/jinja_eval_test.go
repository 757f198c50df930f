package tokenizer

import (
	"strings"
	"testing"
	"time"
)

// TestJinjaArithmetic pins Python's number semantics (floor division and
// modulo toward -inf, int and float kinds, the division-by-zero errors).
func TestJinjaArithmetic(t *testing.T) {
	tk := chatTokenizer(nil, "")
	for _, c := range []struct{ expr, want string }{
		{"7 // 2", "3"},
		{"-7 // 2", "-4"},
		{"7 // -2", "-4"},
		{"7 % 3", "1"},
		{"-7 % 3", "2"},
		{"7 % -3", "-2"},
		{"7 / 2", "3.5"},
		{"1 / 0", "error: division by zero"},
		{"1 // 0", "error: integer division by zero"},
		{"1 % 0", "error: integer modulo by zero"},
		{"1.5 // 0", "error: division by zero"},
		{"1.5 % 0", "error: modulo by zero"},
		{"1.5 / 0", "error: division by zero"},
		{"2 ** 10", "1024"},
		{"2 ** -1", "0.5"},
		{"7.5 // 2", "3.0"},
		{"-7.5 % 2", "0.5"},
		{"3 + 4", "7"},
		{"3 - 4.5", "-1.5"},
		{"3 * 4", "12"},
		{"true + 1", "2"},
		{"'a' + 'b'", "ab"},
		{"[1] * 2", "[1, 1]"},
		{"2.0 ** 0.5", "1.4142135623730951"},
		{"x + 1", "error: \"x\" is undefined (operand of +)"},
	} {
		out, err := tk.RenderChatTemplate("{{ "+c.expr+" }}", nil, false)
		if err != nil {
			out = "error: " + strings.TrimPrefix(err.Error(), "chat template: ")
		}
		if out != c.want {
			t.Errorf("%s: got %q, want %q", c.expr, out, c.want)
		}
	}
}

func TestStrftime(t *testing.T) {
	at := time.Date(2026, time.March, 7, 9, 5, 3, 0, time.UTC) // a Saturday
	if got, want := strftime(at, "%Y-%m-%d %H:%M:%S %B %b %A %a %% %"), "2026-03-07 09:05:03 March Mar Saturday Sat % %"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
