package quant

import (
	"encoding/binary"
	"math"
	"runtime"
	"testing"
)

// Benchmarks of the CPU NVFP4 matvec against float32 and bfloat16 matvecs of
// the same shape. b.SetBytes counts the weight bytes each call reads (for
// NVFP4: packed values plus block scales), so the MB/s column is the weight
// bandwidth achieved.
//
//	go test ./quant -run '^$' -bench 'MatVec' -benchtime 20x

const benchN, benchK = 4096, 4096

// f32MatVecRows is a plain float32 reference matvec (two accumulators).
func f32MatVecRows(dst, w, x []float32, k, r0, r1 int) {
	x = x[:k]
	for r := r0; r < r1; r++ {
		row := w[r*k : (r+1)*k]
		dst[r] = dot(row, x)
	}
}

// bf16MatVecRows is a plain bfloat16 reference matvec: 4 weights per 8-byte
// load, converted by a shift.
func bf16MatVecRows(dst []float32, w []byte, x []float32, k, r0, r1 int) {
	x = x[:k]
	for r := r0; r < r1; r++ {
		row := w[r*2*k : (r+1)*2*k]
		var a, b float32
		for i := 0; i+4 <= k; i += 4 {
			v := binary.LittleEndian.Uint64(row[2*i:])
			xs := x[i : i+4 : i+4]
			a += math.Float32frombits(uint32(v)<<16)*xs[0] + math.Float32frombits(uint32(v>>16)<<16)*xs[1]
			b += math.Float32frombits(uint32(v>>32)<<16)*xs[2] + math.Float32frombits(uint32(v>>48)<<16)*xs[3]
		}
		dst[r] = a + b
	}
}

type matvecBench struct {
	nv   *NVFP4
	f32  []float32
	bf16 []byte
	x    []float32
	dst  []float32
}

func newMatvecBench(b *testing.B) *matvecBench {
	b.Helper()
	w := gaussian(7, benchN*benchK)
	nv, err := QuantizeNVFP4Parallel(w, benchN, benchK, 0)
	if err != nil {
		b.Fatal(err)
	}
	bf := make([]byte, 2*len(w))
	EncodeBF16(bf, w)
	return &matvecBench{nv: nv, f32: w, bf16: bf, x: gaussian(8, benchK), dst: make([]float32, benchN)}
}

func BenchmarkMatVec(b *testing.B) {
	mb := newMatvecBench(b)
	procs := runtime.GOMAXPROCS(0)
	for _, workers := range []int{1, procs} {
		name := "1core"
		if workers != 1 {
			name = "allcores"
		}
		b.Run("nvfp4/"+name, func(b *testing.B) {
			b.SetBytes(int64(mb.nv.Bytes()))
			for b.Loop() {
				ParallelRows(benchN, workers, func(r0, r1 int) { mb.nv.MatVecRows(mb.dst, mb.x, r0, r1) })
			}
		})
		b.Run("bf16/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(mb.bf16)))
			for b.Loop() {
				ParallelRows(benchN, workers, func(r0, r1 int) { bf16MatVecRows(mb.dst, mb.bf16, mb.x, benchK, r0, r1) })
			}
		})
		b.Run("f32/"+name, func(b *testing.B) {
			b.SetBytes(int64(4 * len(mb.f32)))
			for b.Loop() {
				ParallelRows(benchN, workers, func(r0, r1 int) { f32MatVecRows(mb.dst, mb.f32, mb.x, benchK, r0, r1) })
			}
		})
	}
}

// BenchmarkNVFP4MatMul: a prefill-shaped product (16 activation rows).
func BenchmarkNVFP4MatMul(b *testing.B) {
	const mrows = 16
	mb := newMatvecBench(b)
	x := gaussian(9, mrows*benchK)
	dst := make([]float32, mrows*benchN)
	b.SetBytes(int64(mb.nv.Bytes()))
	for b.Loop() {
		mb.nv.MatMul(dst, x, mrows, 0)
	}
	b.ReportMetric(float64(2*mrows*benchN*benchK)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkQuantizeNVFP4: quantization throughput, MB/s of float32 input.
func BenchmarkQuantizeNVFP4(b *testing.B) {
	const rows, cols = 1024, 4096
	w := gaussian(10, rows*cols)
	b.SetBytes(int64(4 * len(w)))
	for b.Loop() {
		if _, err := QuantizeNVFP4Parallel(w, rows, cols, 0); err != nil {
			b.Fatal(err)
		}
	}
}
