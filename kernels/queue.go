package kernels

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"unsafe"
)

// The backend does not launch kernels as its methods are called: it queues
// them, and launches the queue when something needs the stream (a read, a
// write, Sync, a profile, a direct driver call through Backend.onContext).
// A decode step is thus one queue, and the same queue comes back every step.
// A queue that starts while the device is still busy (a step queued ahead
// of the previous token's read, GraphsAuto) is held whole: the second time
// it is seen it is captured as a CUDA graph, and from then on the graph is
// replayed, one driver call instead of hundreds of launches. Any other queue
// launches its older operations while it is still being built (push). What
// changes from step to step, the position and the token ids, lives in a
// small device array (dyn) that the kernels read and that is
// written before each launch of the queue; the queue refers to it only by
// offsets relative to the step's first position, so consecutive steps queue
// identical work. Queued NVFP4 matmuls that read the same input, SwiGLU and
// residual adds after them, and RoPEs of q and k are fused as they are
// queued, over the last fuseWindow operations of the step (pass.go, fuse.go).

type opKind uint8

const (
	opKernel opKind = iota
	opCopy          // params: dst, src, bytes
	opBLAS          // a cublasGemmEx call (cublas.go: queueGemmEx's params)
)

// op is one queued stream operation. A kernel's parameters are 8-byte slots;
// offs[i] is the first slot of parameter i (a struct parameter takes several).
type op struct {
	kind     opKind
	name     string
	fn       uintptr
	grid     [3]uint32
	block    uint32
	shared   uint32
	params   []uint64
	offs     []uint16
	pdl      bool      // the kernel waits for its predecessor itself (pdl_wait): launch it with programmatic serialization
	cluster  uint32    // blocks per thread block cluster along y (0: no clusters)
	clusterX uint32    // blocks per thread block cluster along x (0: no clusters)
	gemv     *gemvOp   // an NVFP4 matmul that later operations may fuse into
	rope     *ropeOp   // a RoPE that the next RoPE may join
	norm     *normOp   // an RMSNorm that the next matmul may take in
	hnorm    *headNorm // an in-place RMSNorm of rows that a one-row attention may take in (attnRow)
	fx       effects   // what the kernel reads and writes, where known (pass.go); the zero value: anything
}

func (o *op) equal(p *op) bool {
	return o.kind == p.kind && o.fn == p.fn && o.grid == p.grid && o.block == p.block && o.shared == p.shared && o.cluster == p.cluster && o.clusterX == p.clusterX &&
		slices.Equal(o.params, p.params) && slices.Equal(o.offs, p.offs)
}

// dynSlots is the size of the device array of per-step values: the base
// position, then the token ids of every Embed in the queue.
const dynSlots = 1 << 16

// queue is the work not yet launched; Backend.qmu guards it and the stream.
type queue struct {
	ops     []op
	dyn     []int32 // host values of the dyn array for this queue
	sent    int     // dyn[:sent] is on the device already (launched ahead)
	hasBase bool    // dyn[0] holds a position
	decided bool    // graph is set for this queue (at its first operation)
	graph   bool    // launched as a graph (replayed once seen before), not op by op while queued
	keep    []any   // buffers and weights the queued work uses, alive until launch
}

// launchAhead: launched op by op, a queue launches its older operations
// while the step is still being queued once it holds this many, so that the
// device starts on a step while the host queues the rest of it (DeepSeek-V4
// queues over a thousand kernels a token). The newest fuseWindow operations
// stay queued for the fusion pass (pass.go).
const launchAhead = 16

type graphEntry struct {
	ops  []op
	exec uintptr
}

// autoRecheck: GraphsAuto asks again, every this many operations, whether
// the device is still busy with earlier work while a queue is held for a
// graph (a long queue, as a prefill, built while another run ends).
const autoRecheck = 64

// Graph cache bounds: entries kept, and queues shorter than this are launched
// directly (a graph launch costs about as much as a few kernel launches).
const (
	maxGraphs    = 32
	minGraphOps  = 8
	captureAfter = 1 // capture a queue seen this many times before
)

// posRel returns pos relative to the queue's base position (setting the base
// to pos if the queue has none).
func (q *queue) posRel(pos int) int {
	if !q.hasBase {
		if len(q.dyn) == 0 {
			q.dyn = append(q.dyn, 0)
		}
		q.dyn[0] = int32(pos)
		q.hasBase = true
		q.sent = 0 // dyn[0] changed: sent again with the next launch
	}
	return pos - int(q.dyn[0])
}

// addIDs appends ids to the dyn array and returns their slot, or -1 when the
// array is full (the caller launches the queue and tries again).
func (q *queue) addIDs(ids []int32) int {
	if len(q.dyn) == 0 {
		q.dyn = append(q.dyn, 0)
	}
	if len(q.dyn)+len(ids) > dynSlots {
		return -1
	}
	off := len(q.dyn)
	q.dyn = append(q.dyn, ids...)
	return off
}

// enqueue queues a kernel. args are uint64 (device pointers), int, float32,
// float64, []int32 (a by-value block of ints, as IdBlock) or []uint64 (a
// by-value struct, as 8-byte slots).
func (b *Backend) enqueue(name string, grid [3]int, block, shared int, args ...any) {
	b.enqueueFx(effects{}, name, grid, block, shared, args...)
}

// enqueueFx is enqueue of a kernel whose memory effects are fx, so that
// the fusion pass may move operations past it (pass.go).
func (b *Backend) enqueueFx(fx effects, name string, grid [3]int, block, shared int, args ...any) {
	o := op{kind: opKernel, name: name, fn: b.function(name), fx: fx,
		grid:  [3]uint32{uint32(grid[0]), uint32(max(grid[1], 1)), uint32(max(grid[2], 1))},
		block: uint32(block), shared: uint32(shared)}
	if o.fn == 0 {
		return // b.function kept the error for Sync
	}
	o.pdl = pdlKernel(name)
	o.setParams(args...)
	b.qmu.Lock()
	b.push(o)
	b.qmu.Unlock()
}

// push appends o to the queue (deciding at its first operation whether the
// queue is a graph's) and, launched op by op, launches all but the newest
// operation once the queue holds b.ahead (launchAhead unless
// Options.LaunchAhead sets another count; 0 here turns it off). qmu must be held.
func (b *Backend) push(o op) {
	q := &b.q
	if !q.decided {
		q.decided = true
		q.graph = b.graphs == GraphsOn || b.graphs == GraphsAuto && b.streamBusy()
	}
	if o.kind == opBLAS {
		q.graph = false // cuBLAS is never captured (cublas.go)
	}
	q.ops = append(q.ops, o)
	b.pushed++
	b.pushes++
	if q.graph && b.graphs == GraphsAuto && len(q.ops)%autoRecheck == 0 && !b.streamBusy() {
		q.graph = false // the device ran dry while the queue was held: launch it as it is built
	}
	// The newest fuseWindow operations stay queued for the fusion pass.
	if b.ahead == 0 || len(q.ops) < max(b.ahead, 1)+fuseWindow || q.graph || b.profiling {
		return
	}
	n := len(q.ops) - fuseWindow
	b.d.onContext(b.ctx, func() { b.launchQueued(q.ops[:n], false) })
	k := copy(q.ops, q.ops[n:])
	clear(q.ops[k:])
	q.ops = q.ops[:k]
}

// launchQueued finalizes ops, sends the step values they read and launches
// them (replaying or capturing a graph when graph is set), then drops what
// they held for fusion, keeping the op slices for reuse. It runs with qmu
// held and the context current.
func (b *Backend) launchQueued(ops []op, graph bool) {
	for i := range ops {
		b.finalize(&ops[i])
	}
	b.sendDyn()
	if graph && !hasBLAS(ops) {
		b.launchGraph(ops)
	} else {
		b.launchOps(ops)
	}
	for i := range ops {
		ops[i].gemv, ops[i].rope, ops[i].norm, ops[i].hnorm = nil, nil, nil, nil
	}
}

// sendDyn copies the step values not yet on the device there, in stream
// order. It runs with qmu held and the context current.
func (b *Backend) sendDyn() {
	q := &b.q
	if len(q.dyn) > q.sent {
		b.setErr(b.d.check("cuMemcpyHtoDAsync (step values)",
			b.d.cuMemcpyHtoDAsync(b.dyn.ptr+uint64(4*q.sent), unsafe.Pointer(&q.dyn[q.sent]), uintptr(4*(len(q.dyn)-q.sent)), b.stream)))
		q.sent = len(q.dyn)
	}
}

// setSlots sets o's parameters to vals, one 8-byte slot each (device
// pointers as they are, ints through slotInt, floats through slotF32):
// setParams without boxing every argument in an interface, which allocated
// for most of them, on the paths that queue an op for every layer.
func (o *op) setSlots(vals ...uint64) {
	o.params = append(o.params[:0], vals...)
	if cap(o.offs) < len(vals) {
		o.offs = make([]uint16, 0, len(vals))
	}
	o.offs = o.offs[:len(vals)]
	for i := range o.offs {
		o.offs[i] = uint16(i)
	}
}

// setStruct sets o's one parameter, a struct of len(v) slots.
func (o *op) setStruct(v []uint64) {
	o.params = append(o.params[:0], v...)
	o.offs = append(o.offs[:0], 0)
}

// slotInt and slotF32 are an int and a float32 parameter's slots, as
// setParams writes them.
func slotInt(v int) uint64     { return uint64(uint32(int32(v))) }
func slotF32(v float32) uint64 { return uint64(math.Float32bits(v)) }

func (o *op) setParams(args ...any) {
	// Sized once: a step queues about a thousand ops (DeepSeek-V4), and
	// growing each op's slices by appends was most of what building its
	// queue allocated.
	slots := 0
	for _, a := range args {
		switch v := a.(type) {
		case []int32:
			slots += (len(v) + 1) / 2
		case []uint64:
			slots += len(v)
		default:
			slots++
		}
	}
	if cap(o.params) < slots {
		o.params = make([]uint64, 0, slots)
	}
	if cap(o.offs) < len(args) {
		o.offs = make([]uint16, 0, len(args))
	}
	o.params = o.params[:0]
	o.offs = o.offs[:0]
	for _, a := range args {
		o.offs = append(o.offs, uint16(len(o.params)))
		switch v := a.(type) {
		case uint64:
			o.params = append(o.params, v)
		case int:
			o.params = append(o.params, uint64(uint32(int32(v))))
		case float32:
			o.params = append(o.params, uint64(math.Float32bits(v)))
		case float64:
			o.params = append(o.params, math.Float64bits(v))
		case []int32:
			for i := 0; i < len(v); i += 2 {
				w := uint64(uint32(v[i]))
				if i+1 < len(v) {
					w |= uint64(uint32(v[i+1])) << 32
				}
				o.params = append(o.params, w)
			}
		case []uint64:
			o.params = append(o.params, v...)
		default:
			panic(fmt.Sprintf("kernels: launch %s: argument of type %T", o.name, a))
		}
	}
}

// onContext runs fn with the backend's context current on this thread, after
// launching everything queued. Code that calls the driver directly (copies,
// synchronization, events) goes through it, so that queued work comes first.
func (b *Backend) onContext(fn func()) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	b.d.onContext(b.ctx, func() {
		b.flushLocked()
		fn()
	})
}

// flushLocked launches the queue: as a cached graph, by capturing one, or
// kernel by kernel. It runs with qmu held and the context current.
func (b *Backend) flushLocked() {
	q := &b.q
	b.gemmX = gemmXHeld{} // what follows may write x directly
	graph := q.graph
	q.decided, q.graph = false, false
	if len(q.ops) == 0 {
		q.dyn, q.sent, q.hasBase, q.keep = q.dyn[:0], 0, false, q.keep[:0]
		return
	}
	b.launchQueued(q.ops, !b.profiling && graph && len(q.ops) >= minGraphOps)
	clear(q.keep)
	q.ops, q.dyn, q.sent, q.hasBase, q.keep = q.ops[:0], q.dyn[:0], 0, false, q.keep[:0]
	b.freeQueued()
}

func (b *Backend) launchOps(ops []op) {
	for i := range ops {
		o := &ops[i]
		if b.exp.skip(o) { // the dev build's MANIFOLD_SKIP; never in production
			continue
		}
		var ev uintptr
		if b.profiling {
			ev = b.recordStart()
		}
		b.launchOp(o)
		if b.profiling {
			b.recordEnd(o.name, ev)
		}
	}
}

func (b *Backend) launchOp(o *op) {
	switch o.kind {
	case opCopy:
		b.setErr(b.d.check("cuMemcpyDtoDAsync", b.d.cuMemcpyDtoDAsync(o.params[0], o.params[1], uintptr(o.params[2]), b.stream)))
	case opBLAS:
		b.launchBLAS(o) // cublas.go
	case opKernel:
		ptrs := b.paramPtrs[:0]
		for _, off := range o.offs {
			ptrs = append(ptrs, unsafe.Pointer(&o.params[off]))
		}
		var p unsafe.Pointer
		if len(ptrs) > 0 {
			p = unsafe.Pointer(&ptrs[0])
		}
		var r int32
		if pdl := o.pdl && b.pdl && !b.profiling; pdl || o.cluster > 0 || o.clusterX > 0 {
			r = b.launchEx(o, p, pdl)
		} else {
			r = b.d.cuLaunchKernel(o.fn, o.grid[0], o.grid[1], o.grid[2], o.block, 1, 1, o.shared, b.stream, p, nil)
		}
		if r != 0 { // the name is only joined for an error: a launch allocates nothing
			b.setErr(b.d.check("launch "+o.name, r))
		}
		b.paramPtrs = ptrs[:0]
	}
}

// Programmatic dependent launch: a kernel launched with programmatic stream
// serialization may start while the kernel before it drains; it calls
// pdl_wait (manifold.cu) before touching what earlier work wrote, and the NVFP4
// matmuls start their weight copies before that wait. Graph capture keeps
// the relation as a programmatic edge.

// pdlKernel reports whether kernel name is launched with programmatic stream
// serialization: every kernel but those of plainKernel, each of which waits
// (pdl_wait, or pdl_entry first thing) before it reads what earlier work
// wrote or writes what earlier work reads (TestKernelsWaitForPredecessor).
func pdlKernel(name string) bool { return !plainKernel(name) }

// plainKernel reports whether kernel name is launched plainly, after every
// earlier kernel has finished (plainKernels).
func plainKernel(name string) bool { return slices.Contains(plainKernels(), name) }

// plainKernels are the kernels launched plainly: the top-k kernels and the
// weights' scale, so that overlapAfter may let the kernel after one of them
// read older inputs before its wait; and those readers themselves (the
// indexer and the sparse attentions), which only overlapAfter launches early.
func plainKernels() []string {
	return []string{"scale", "topk_select", "tkm_hist", "tkm_count", "tkm_emit", "tkc_select", "tkc_select16",
		"idx_scores_mma", "dsa_attend_mma", "dsa_attend_mma16", "v4_attention_mma", "v4_attention_mma16"}
}

// launchConfig and launchAttribute are CUlaunchConfig and CUlaunchAttribute.
type launchConfig struct {
	grid   [3]uint32
	block  [3]uint32
	shared uint32
	_      uint32
	stream uintptr
	attrs  *launchAttribute
	nattrs uint32
	_      uint32
}

type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

const (
	attrClusterDimension                = 4 // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
	attrProgrammaticStreamSerialization = 6 // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
)

// launchEx launches o with cuLaunchKernelEx: with programmatic stream
// serialization when pdl is set, in clusters of o.clusterX by o.cluster
// blocks (x by y) when either is not 0.
func (b *Backend) launchEx(o *op, params unsafe.Pointer, pdl bool) int32 {
	n := 0
	if pdl {
		a := &b.launchAttrs[n]
		*a = launchAttribute{id: attrProgrammaticStreamSerialization}
		a.value[0] = 1 // programmaticStreamSerializationAllowed
		n++
	}
	if o.cluster > 0 || o.clusterX > 0 {
		a := &b.launchAttrs[n]
		*a = launchAttribute{id: attrClusterDimension}
		binary.NativeEndian.PutUint32(a.value[0:], max(o.clusterX, 1))
		binary.NativeEndian.PutUint32(a.value[4:], max(o.cluster, 1))
		binary.NativeEndian.PutUint32(a.value[8:], 1)
		n++
	}
	cfg := &b.launchCfg
	*cfg = launchConfig{grid: o.grid, block: [3]uint32{o.block, 1, 1}, shared: o.shared, stream: b.stream, attrs: &b.launchAttrs[0], nattrs: uint32(n)}
	return b.d.cuLaunchKernelEx(unsafe.Pointer(cfg), o.fn, params, nil)
}

// SetPDL turns programmatic dependent launch on or off (on by default);
// graphs captured under the other setting are dropped.
func (b *Backend) SetPDL(on bool) {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	if b.pdl != on {
		b.d.onContext(b.ctx, func() {
			b.flushLocked()
			b.destroyGraphs()
		})
		clear(b.graphSeen)
	}
	b.pdl = on
}

var graphSeed = maphash.MakeSeed()

func signature(ops []op) uint64 {
	var h maphash.Hash
	h.SetSeed(graphSeed)
	var buf [8]byte
	put := func(v uint64) {
		for i := range buf {
			buf[i] = byte(v >> (8 * i))
		}
		h.Write(buf[:])
	}
	for i := range ops {
		o := &ops[i]
		put(uint64(o.kind)<<56 ^ uint64(o.fn))
		put(uint64(o.grid[0]) | uint64(o.grid[1])<<32)
		put(uint64(o.grid[2]) | uint64(o.block)<<32)
		put(uint64(o.shared) | uint64(len(o.params))<<32)
		put(uint64(o.cluster) | uint64(o.clusterX)<<32)
		for _, p := range o.params {
			put(p)
		}
	}
	return h.Sum64()
}

func (b *Backend) launchGraph(ops []op) {
	sig := signature(ops)
	if e := b.graphCache[sig]; e != nil && len(e.ops) == len(ops) {
		same := true
		for i := range ops {
			if !ops[i].equal(&e.ops[i]) {
				same = false
				break
			}
		}
		if same {
			b.setErr(b.d.check("cuGraphLaunch", b.d.cuGraphLaunch(e.exec, b.stream)))
			b.graphLaunches++
			return
		}
	}
	if b.graphSeen[sig] < captureAfter {
		if len(b.graphSeen) > 4096 { // queues that never repeat
			clear(b.graphSeen)
		}
		b.graphSeen[sig]++
		b.launchOps(ops)
		return
	}
	exec, err := b.capture(ops)
	if err != nil {
		// Capture failed (some operation is not capturable): launch directly from now on.
		b.graphs = GraphsOff
		b.launchOps(ops)
		return
	}
	if len(b.graphCache) >= maxGraphs {
		for k, e := range b.graphCache {
			b.d.cuGraphExecDestroy(e.exec)
			delete(b.graphCache, k)
		}
		clear(b.graphSeen)
	}
	saved := make([]op, len(ops))
	for i, o := range ops {
		saved[i] = op{kind: o.kind, name: o.name, fn: o.fn, grid: o.grid, block: o.block, shared: o.shared, cluster: o.cluster, clusterX: o.clusterX,
			params: slices.Clone(o.params), offs: slices.Clone(o.offs)}
	}
	b.graphCache[sig] = &graphEntry{ops: saved, exec: exec}
	b.setErr(b.d.check("cuGraphLaunch", b.d.cuGraphLaunch(exec, b.stream)))
	b.graphLaunches++
}

// capture records ops into a graph and instantiates it.
func (b *Backend) capture(ops []op) (uintptr, error) {
	const threadLocal = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
	if err := b.d.check("cuStreamBeginCapture", b.d.cuStreamBeginCapture(b.stream, threadLocal)); err != nil {
		return 0, err
	}
	b.mu.Lock()
	saved := b.err
	b.mu.Unlock()
	for i := range ops {
		b.launchOp(&ops[i])
	}
	var graph uintptr
	err := b.d.check("cuStreamEndCapture", b.d.cuStreamEndCapture(b.stream, &graph))
	b.mu.Lock()
	failed := b.err != saved
	b.mu.Unlock()
	if err == nil && failed {
		err = fmt.Errorf("kernels: a launch failed during graph capture")
	}
	if err != nil {
		if graph != 0 {
			b.d.cuGraphDestroy(graph)
		}
		b.mu.Lock()
		b.err = saved // the direct launches that follow report their own errors
		b.mu.Unlock()
		return 0, err
	}
	var exec uintptr
	err = b.d.check("cuGraphInstantiate", b.d.cuGraphInstantiateWithFlags(&exec, graph, 0))
	b.d.cuGraphDestroy(graph)
	return exec, err
}

// GraphMode says which queues the backend launches as CUDA graphs.
type GraphMode int

const (
	// GraphsAuto (the default) captures and replays the queues that start
	// while the device is still busy, as a decode step queued before the
	// previous token's id is read back (engine's Generate), and launches the
	// others kernel by kernel while they are queued, as a step built while
	// the device waits for it; a held queue that the device runs dry under
	// (asked every autoRecheck operations) goes over to the latter. On the
	// H100 it keeps graphs' 1% on the pipelined Llama-3-8B-shape decode and
	// direct launches where graphs lose 14-25% (docs/DECISIONS.md).
	GraphsAuto GraphMode = iota
	// GraphsOff launches every kernel directly.
	GraphsOff
	// GraphsOn replays every repeated queue of minGraphOps or more as a graph.
	GraphsOn
)

// String is the mode's name: auto, off or on.
func (m GraphMode) String() string {
	switch m {
	case GraphsOff:
		return "off"
	case GraphsOn:
		return "on"
	}
	return "auto"
}

// SetGraphs sets which queues are captured and replayed as CUDA graphs,
// from the next queue on.
func (b *Backend) SetGraphs(m GraphMode) {
	b.qmu.Lock()
	b.graphs = m
	b.qmu.Unlock()
}

// cudaErrorNotReady is CUDA_ERROR_NOT_READY: cuStreamQuery's answer while
// the stream has work in flight.
const cudaErrorNotReady = 600

// streamBusy reports whether the stream still has work in flight. qmu must
// be held.
func (b *Backend) streamBusy() bool {
	var r int32
	b.d.onContext(b.ctx, func() { r = b.d.cuStreamQuery(b.stream) })
	return r == cudaErrorNotReady
}

// GraphLaunches is the number of queues launched as graphs so far.
func (b *Backend) GraphLaunches() int {
	b.qmu.Lock()
	defer b.qmu.Unlock()
	return b.graphLaunches
}

func (b *Backend) destroyGraphs() {
	for k, e := range b.graphCache {
		b.d.cuGraphExecDestroy(e.exec)
		delete(b.graphCache, k)
	}
}
