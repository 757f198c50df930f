package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
	"github.com/manifoldlm/manifold/weights/convert"
)

// BenchmarkConvert measures converter throughput in MB/s of source on a
// Llama-shape model (2 layers, hidden 1024, FFN 2816, vocab 8192: 39M
// parameters) stored as BF16 and as F32, and on one layer of DeepSeek-V4-Flash
// as released (FP8 linears, 16 MXFP4 experts re-blocked: 0.5 GB), using all
// cores. It also reports the peak Go heap as a multiple of the largest source
// tensor.
//
//	go test ./cmd/convert -run '^$' -bench Convert -benchtime 4x
func BenchmarkConvert(b *testing.B) {
	for _, c := range []struct {
		name  string
		model testmodel.Writer
	}{
		{"BF16", testmodel.Llama{Layers: 2, Hidden: 1024, FFN: 2816, Heads: 16, KVHeads: 4, Vocab: 8192, DType: weights.BF16, Seed: 1}},
		{"F32", testmodel.Llama{Layers: 2, Hidden: 1024, FFN: 2816, Heads: 16, KVHeads: 4, Vocab: 8192, DType: weights.F32, Seed: 1}},
		{"v4-fp8-mxfp4", testmodel.DeepseekV4{Vocab: 8192, Layers: 1, Experts: 16, Seed: 1, Released: testmodel.V4FP8MXFP4}},
	} {
		b.Run(c.name, func(b *testing.B) {
			in := testmodel.WriteTemp(b, c.model)
			st, err := os.Stat(filepath.Join(in, "model.safetensors"))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(st.Size())
			work := b.TempDir()
			var rep *convert.Report
			i := 0
			for b.Loop() {
				out := filepath.Join(work, fmt.Sprint(i))
				i++
				if rep, err = convert.Convert(context.Background(), convert.Options{In: in, Out: out}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(out)
				b.StartTimer()
			}
			b.ReportMetric(float64(rep.PeakHeap)/float64(rep.LargestSource), "peakheap/largest")
			b.ReportMetric(100*rep.Overall(), "relRMS%")
		})
	}
}
