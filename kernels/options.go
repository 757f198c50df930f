package kernels

import "fmt"

// Options are the CUDA backend's production settings. Each one decides only
// how the work is scheduled on the device, never what it computes: every
// value gives bitwise the same results (engine's TestKnobsKeepGoldenOutputs).
// The zero value is the default of each. No environment variable changes
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
}

// Validate reports an Options value out of range.
func (o Options) Validate() error {
	if o.Graphs < GraphsAuto || o.Graphs > GraphsOn {
		return fmt.Errorf("kernels: Options.Graphs %d: want GraphsAuto, GraphsOff or GraphsOn", int(o.Graphs))
	}
	return nil
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
