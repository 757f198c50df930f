package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
)

func TestGenerateIDs(t *testing.T) {
	dir := filepath.Join(golden.Dir(t), "llama")
	var out, errOut bytes.Buffer
	err := run([]string{"-model", dir, "-ids", "1,2,3", "-max-tokens", "5", "-ignore-eos", "-seed", "1", "-device", "cpu"}, &out, &errOut)
	if err != nil {
		t.Fatal(err, errOut.String())
	}
	if n := len(strings.Fields(out.String())); n != 5 {
		t.Errorf("stdout %q: want 5 ids", out.String())
	}
	for _, want := range []string{"loaded", "cpu", "prompt: 3 tokens", "decode: 5 tokens", "tokens/s"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr %q lacks %q", errOut.String(), want)
		}
	}
}

func TestGenerateBadArgs(t *testing.T) {
	dir := filepath.Join(golden.Dir(t), "llama")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-model", dir}, "-prompt"},
		{[]string{"-model", dir, "-ids", "1", "-prompt", "x"}, "one of the two"},
		{[]string{"-model", dir, "-ids", "1,x"}, `"x"`},
		{[]string{"-model", dir, "-prompt", "hello"}, "tokenizer.json"},
		{[]string{"-model", filepath.Join(dir, "missing"), "-ids", "1"}, "missing"},
		{[]string{"-model", dir, "-ids", "1", "-device", "tpu"}, "tpu"},
		{[]string{"-model", dir, "-ids", "1", "-max-tokens", "-1"}, "-max-tokens"},
		{[]string{"-model", dir, "-ids", "1", "-top-p", "1.5"}, "TopP"},
		{[]string{"-model", dir, "-ids", "1", "-temperature", "NaN"}, "Temperature"},
		{[]string{"-model", dir, "-ids", "1", "-stop", ""}, "empty stop string"},
		{[]string{"-model", dir, "-ids", "1", "-stop", "x"}, "-stop"},
	} {
		var out, errOut bytes.Buffer
		err := run(tc.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
}
