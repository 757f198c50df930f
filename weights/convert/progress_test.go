package convert

import (
	"strings"
	"testing"
	"time"
)

// TestProgressRate: a conversion's first steps, done in microseconds from
// the page cache, show no rate or ETA (before, 1 MB in 1 ns read as
// "1000.0 TB/s"); once half a second has passed they show a finite one.
func TestProgressRate(t *testing.T) {
	var b strings.Builder
	p := newProgress(&b, false, 10<<20)
	p.add(2<<20, "a") // 20%: a line
	if line := b.String(); !strings.Contains(line, "--/s ETA --:--") {
		t.Errorf("first line %q: want no rate and no ETA yet", line)
	}
	b.Reset()
	p.start = time.Now().Add(-2 * time.Second)
	p.add(2<<20, "b")
	line := b.String()
	if strings.Contains(line, "--/s") || !strings.Contains(line, "/s ETA 0:0") {
		t.Errorf("line after 2 s %q: want a rate (about 2 MB/s) and an ETA of a few seconds", line)
	}
}
