package engine

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeExample: the code of README.md's "Use it as a library" is the
// body of Example_library (engine/example_test.go), which the compiler
// checks, so the README's code compiles against the API as it is.
func TestReadmeExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Use it as a library\n")
	if !ok {
		t.Fatal(`README.md has no "## Use it as a library" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, code, ok := strings.Cut(section, "\n```go\n")
	if code, _, ok = strings.Cut(code, "\n```\n"); !ok {
		t.Fatal(`no Go code block in README.md's "Use it as a library"`)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(src), "\nfunc Example_library() {\n")
	if body, _, ok = strings.Cut(body, "\n}\n"); !ok {
		t.Fatal("no Example_library in example_test.go")
	}
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	if got := strings.Join(lines, "\n"); got != code {
		t.Errorf("README.md's library code and Example_library differ:\nREADME:\n%s\n\nExample_library:\n%s", code, got)
	}
}
