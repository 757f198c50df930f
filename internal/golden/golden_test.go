package golden

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
)

// skipTB records a skip instead of ending the test.
type skipTB struct {
	testing.TB
	msg string
}

type skipped struct{}

func (s *skipTB) Helper()                   {}
func (s *skipTB) Skip(args ...any)          { s.msg = fmt.Sprint(args...); panic(skipped{}) }
func (s *skipTB) Skipf(string, ...any)      { panic("Dir skips with Skip") }
func (s *skipTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

// TestMissingFixturesAreLoud: without the fixtures Dir skips with a message
// that says nothing was checked, and the first skip of the process writes
// one summary line (the second writes none).
func TestMissingFixturesAreLoud(t *testing.T) {
	missing := t.TempDir() + "/nowhere"
	t.Setenv("MANIFOLD_GOLDEN_DIR", missing)
	var out bytes.Buffer
	summary, missingOnce = &out, sync.Once{}
	dir := func() (tb *skipTB) {
		tb = &skipTB{TB: t}
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(skipped); !ok {
					panic(r)
				}
			}
		}()
		Dir(tb)
		return tb
	}
	first, second := dir(), dir()
	for _, tb := range []*skipTB{first, second} {
		if !strings.Contains(tb.msg, "SKIPPED, nothing checked") || !strings.Contains(tb.msg, missing) || !strings.Contains(tb.msg, "MANIFOLD_GOLDEN_DIR") {
			t.Errorf("skip message %q", tb.msg)
		}
	}
	if got := out.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "FIXTURES MISSING at "+missing) || !strings.Contains(got, "SKIPPED") {
		t.Errorf("summary %q: want one line naming the folder", got)
	}
}

// TestFindFile: a file where the folder should be is missing fixtures too.
func TestFindFile(t *testing.T) {
	f := t.TempDir() + "/file"
	if err := writeFile(f); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MANIFOLD_GOLDEN_DIR", f)
	if _, err := find(); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Errorf("find() error %v, want not a folder", err)
	}
}

func writeFile(path string) error { return os.WriteFile(path, []byte("x"), 0o644) }
