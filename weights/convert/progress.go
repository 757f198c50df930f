package convert

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws a progress bar with throughput and ETA. On a terminal it
// redraws one line at most every 100 ms; otherwise it prints a line at every
// 10% step. A nil writer draws nothing.
type progress struct {
	w        io.Writer
	tty      bool
	total    int64
	done     int64
	start    time.Time
	last     time.Time
	lastStep int64 // last 10% step printed (non-tty)
}

func newProgress(w io.Writer, tty bool, total int64) *progress {
	return &progress{w: w, tty: tty, total: total, start: time.Now(), lastStep: -1}
}

// update shows the tensor being worked on.
func (p *progress) update(name string) {
	if p.w != nil && p.tty && time.Since(p.last) >= 100*time.Millisecond {
		p.draw(name)
	}
}

// add records n more source bytes done.
func (p *progress) add(n int64, name string) {
	p.done += n
	if p.w == nil {
		return
	}
	if p.tty {
		if time.Since(p.last) >= 100*time.Millisecond {
			p.draw(name)
		}
		return
	}
	if step := p.done * 10 / max(p.total, 1); step > p.lastStep {
		p.lastStep = step
		p.draw(name)
	}
}

// finish draws the final state.
func (p *progress) finish() {
	switch {
	case p.w == nil:
	case p.tty:
		p.draw("")
		fmt.Fprintln(p.w)
	case p.lastStep < 10:
		p.draw("")
	}
}

// minRateSeconds is how long a conversion runs before its progress shows a
// rate and an ETA.
const minRateSeconds = 0.5

func (p *progress) draw(name string) {
	p.last = time.Now()
	el := time.Since(p.start).Seconds()
	frac := float64(p.done) / float64(max(p.total, 1))
	const width = 30
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	// A rate over less than half a second (the first tensors come from the
	// page cache in microseconds) is noise: it shows as "--" until then.
	rate, speed, eta := 0.0, "--", "--:--"
	if el >= minRateSeconds && p.done > 0 {
		rate = float64(p.done) / el
		speed = human(int64(rate))
	}
	if rate > 0 && p.done < p.total {
		eta = clock(time.Duration(float64(p.total-p.done) / rate * float64(time.Second)))
	} else if p.done >= p.total {
		eta = "0:00"
	}
	if len(name) > 48 {
		name = "..." + name[len(name)-45:]
	}
	line := fmt.Sprintf("[%s] %5.1f%% %s/%s %7s/s ETA %s %s", bar, 100*frac, human(p.done), human(p.total), speed, eta, name)
	if p.tty {
		fmt.Fprintf(p.w, "\r%-130s", line)
	} else {
		fmt.Fprintln(p.w, strings.TrimRight(line, " "))
	}
}

func clock(d time.Duration) string {
	s := int(d.Round(time.Second).Seconds())
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}
