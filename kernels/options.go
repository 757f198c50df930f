package kernels

import "fmt"

// Options are the CUDA backend's production settings. Each one decides only
// how the work is scheduled on the device, never what it computes: every
// value gives bitwise the same results (engine's TestKnobsKeepGoldenOutputs).
// The zero value is the default of each. The exception is the cuBLAS
// fields (NoCuBLAS, CuBLASMinM, CuBLASNVFP4MinM): they choose which GEMM
// engine multiplies a prefill chunk, at the same precision of x and of the
// weights, but cuBLAS sums K in its own order, so results differ from the
// package's kernels in the last bits of float32 sums (cublas.go); for a given
// value they are deterministic. No environment variable changes
// them, or anything else in a production build; the experiments of kernel
// development live in the dev build (build tag manifold_dev, dev/README.md).
type Options struct {
	// Graphs says which launch queues are captured and replayed as CUDA
	// graphs: GraphsAuto (the zero value) those queued while the device is
	// still busy (a decode step queued ahead of the previous token's read),
	// GraphsOn every repeated queue, GraphsOff none.
	Graphs GraphMode
	// NoPDL turns programmatic dependent launch off: each kernel then starts
	// only once the one before it has finished, instead of overlapping its
	// start (and the NVFP4 matmuls' first weight copies) with that one's end.
	NoPDL bool
	// LaunchAhead is how many operations a queue launched kernel by kernel
	// holds before it launches the older ones while the rest of the step is
	// still being queued: 0 is the default (16), a negative value never
	// (the queue launches when something needs the stream).
	LaunchAhead int
	// NoCuBLAS leaves libcublas unloaded: every matmul on the package's own
	// kernels. Without it, New loads libcublas where the system has one
	// (cublas.go: libcublas.so.13, .12, PyTorch's wheels, /usr/local/cuda*)
	// and takes the prefill matmuls below to cuBLAS; where none loads, the
	// own kernels, silently (Name says which engine runs).
	NoCuBLAS bool
	// CuBLASMinM is the fewest rows x (tokens) of a bf16 weight's matmul
	// that cuBLAS takes (cublasGemmEx over x's two bf16 halves, as the own
	// GEMM takes them): 0 is the default (cublasMinMDefault), a negative
	// value never. Below it the own matvecs and GEMM, which win at decode.
	CuBLASMinM int
	// CuBLASNVFP4MinM is the fewest rows x of an NVFP4 weight's matmul that
	// is computed by dequantizing the weight to fp16 (exactly) and
	// cublasGemmEx: 0 is the default (cublasNVFP4MinMDefault), a negative
	// value never.
	CuBLASNVFP4MinM int
}

// Validate reports an Options value out of range.
func (o Options) Validate() error {
	if o.Graphs < GraphsAuto || o.Graphs > GraphsOn {
		return fmt.Errorf("kernels: Options.Graphs %d: want GraphsAuto, GraphsOff or GraphsOn", int(o.Graphs))
	}
	if o.CuBLASMinM > 0 && o.CuBLASMinM < 2 || o.CuBLASNVFP4MinM > 0 && o.CuBLASNVFP4MinM < 2 {
		return fmt.Errorf("kernels: Options.CuBLASMinM %d, CuBLASNVFP4MinM %d: want 0 (the default), a negative value (never) or at least 2",
			o.CuBLASMinM, o.CuBLASNVFP4MinM)
	}
	return nil
}

// cublasMinM is the row count from which bf16 matmuls go to cuBLAS (0: never).
func (o Options) cublasMinM() int {
	switch {
	case o.NoCuBLAS || o.CuBLASMinM < 0:
		return 0
	case o.CuBLASMinM == 0:
		return cublasMinMDefault
	}
	return o.CuBLASMinM
}

// cublasNVFP4MinM is the row count from which NVFP4 matmuls are dequantized
// onto cuBLAS (0: never).
func (o Options) cublasNVFP4MinM() int {
	switch {
	case o.NoCuBLAS || o.CuBLASNVFP4MinM < 0:
		return 0
	case o.CuBLASNVFP4MinM == 0:
		return cublasNVFP4MinMDefault
	}
	return o.CuBLASNVFP4MinM
}

// ahead is the launch-ahead count push uses (0: never).
func (o Options) ahead() int {
	switch {
	case o.LaunchAhead < 0:
		return 0
	case o.LaunchAhead == 0:
		return launchAhead
	}
	return o.LaunchAhead
}
