package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
)

func TestGenerateIDs(t *testing.T) {
	dir := golden.Path(t, "llama")
	var out, errOut bytes.Buffer
	err := run([]string{"-model", dir, "-ids", "1,2,3", "-max-tokens", "5", "-ignore-eos", "-seed", "1", "-device", "cpu"}, &out, &errOut)
	if err != nil {
		t.Fatal(err, errOut.String())
	}
	// The prompt's ids (echoed), then the generated ones.
	if ids := strings.Fields(out.String()); len(ids) != 8 || strings.Join(ids[:3], ",") != "1,2,3" {
		t.Errorf("stdout %q: want 1 2 3 and 5 ids", out.String())
	}
	for _, want := range []string{"loaded", "cpu", "prompt: 3 tokens", "decode: 5 tokens", "tokens/s"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
}
