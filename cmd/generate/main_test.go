package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
)

// runOK runs the command with args and returns its stdout and stderr,
// failing t (with the stderr) where it fails.
func runOK(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(args, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	return out.String(), errOut.String()
}

func TestGenerateIDs(t *testing.T) {
	out, errOut := runOK(t, "-model", golden.Path(t, "llama"), "-ids", "1,2,3", "-max-tokens", "5", "-ignore-eos", "-seed", "1", "-device", "cpu")
	// The prompt's ids (echoed), then the generated ones.
	if ids := strings.Fields(out); len(ids) != 8 || strings.Join(ids[:3], ",") != "1,2,3" {
		t.Errorf("stdout %q: want 1 2 3 and 5 ids", out)
	}
	for _, want := range []string{"loaded", "cpu", "prompt: 3 tokens", "decode: 5 tokens", "tokens/s"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
}
