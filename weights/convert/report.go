package convert

import (
	"fmt"
	"io"
	"math"
	"sort"
	"time"
)

// TensorStat is the accuracy of one quantized tensor.
type TensorStat struct {
	Name         string
	Shape        []int
	RelRMS       float64 // sqrt(sum (dequantized - source)^2 / sum source^2)
	ErrSq, RefSq float64
}

// Report describes a finished conversion.
type Report struct {
	In, Out         string
	Workers         int
	Stats           []TensorStat // quantized tensors, in checkpoint order
	QuantizedParams int64
	Reblocked       int      // MXFP4 linears (DeepSeek-V4's experts) re-blocked to NVFP4 exactly: no error
	KeptBF16        int      // float tensors written as BF16
	Copied          int      // integer tensors copied as is
	Unquantizable   []string // linear weights kept in BF16 and why
	Exclude         []string // exclude_modules written to the config
	SourceBytes     int64
	LargestSource   int64 // bytes of the largest source tensor (with its FP8 scales)
	OutputBytes     int64
	Elapsed         time.Duration
	PeakHeap        uint64 // peak Go heap during the conversion
	MaxRSS          int64  // peak resident set of the process (0 if unknown)
	// StaleRemoved lists the temporary folders of killed conversions to
	// the same output name that this one removed; StaleLeft those it left
	// because they hold no lock file to tell whether a conversion is still
	// writing them (made by an earlier version, say): remove them by hand
	// once no conversion is running.
	StaleRemoved, StaleLeft []string
}

// Overall returns the relative RMS error over all quantized weights together.
func (r *Report) Overall() float64 {
	var e, s float64
	for _, st := range r.Stats {
		e, s = e+st.ErrSq, s+st.RefSq
	}
	if s == 0 {
		return 0
	}
	return math.Sqrt(e / s)
}

// Write prints the report with the worst tensors by relative error.
func (r *Report) Write(w io.Writer, worst int) {
	secs := r.Elapsed.Seconds()
	fmt.Fprintf(w, "converted %s -> %s in %.2fs: %s source (%.2f GB/s), %s written (%.2fx smaller), %d workers\n",
		r.In, r.Out, secs, human(r.SourceBytes), float64(r.SourceBytes)/1e9/max(secs, 1e-9),
		human(r.OutputBytes), float64(r.SourceBytes)/max(float64(r.OutputBytes), 1), r.Workers)
	fmt.Fprintf(w, "tensors: %d linear weights quantized to NVFP4 (%d parameters), %d kept in BF16, %d copied\n",
		len(r.Stats)+r.Reblocked, r.QuantizedParams, r.KeptBF16, r.Copied)
	if r.Reblocked > 0 {
		fmt.Fprintf(w, "of those, %d MXFP4 linears re-blocked to NVFP4 exactly (same E2M1 codes, power-of-two scales: no error); the accuracy below is the others'\n", r.Reblocked)
	}
	fmt.Fprintf(w, "memory: peak Go heap %s (%.2fx the largest source tensor, %s)", human(int64(r.PeakHeap)),
		float64(r.PeakHeap)/max(float64(r.LargestSource), 1), human(r.LargestSource))
	if r.MaxRSS > 0 {
		fmt.Fprintf(w, ", max RSS %s (includes mapped source pages)", human(r.MaxRSS))
	}
	fmt.Fprintln(w)
	for _, d := range r.StaleRemoved {
		fmt.Fprintf(w, "removed %s, left by a conversion that was killed\n", d)
	}
	for _, d := range r.StaleLeft {
		fmt.Fprintf(w, "left %s: an interrupted conversion's temporary folder, or a running one's; remove it if none is running\n", d)
	}
	for _, u := range r.Unquantizable {
		fmt.Fprintf(w, "kept in BF16: %s\n", u)
	}
	if len(r.Stats) == 0 {
		return
	}
	rels := make([]float64, len(r.Stats))
	var mean float64
	for i, st := range r.Stats {
		rels[i] = st.RelRMS
		mean += st.RelRMS
	}
	mean /= float64(len(rels))
	sort.Float64s(rels)
	fmt.Fprintf(w, "accuracy (relative RMS error of dequantized NVFP4 vs source): overall %.2f%%, mean %.2f%%, median %.2f%%, max %.2f%%\n",
		100*r.Overall(), 100*mean, 100*rels[len(rels)/2], 100*rels[len(rels)-1])
	byErr := append([]TensorStat(nil), r.Stats...)
	sort.SliceStable(byErr, func(i, j int) bool { return byErr[i].RelRMS > byErr[j].RelRMS })
	if worst > len(byErr) {
		worst = len(byErr)
	}
	if worst > 0 {
		fmt.Fprintf(w, "worst %d tensors:\n", worst)
		for _, st := range byErr[:worst] {
			fmt.Fprintf(w, "  %6.2f%%  %s %v\n", 100*st.RelRMS, st.Name, st.Shape)
		}
	}
}

func human(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
