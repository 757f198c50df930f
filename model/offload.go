package model

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/manifoldlm/manifold/backend"
)

// Experts beyond device memory (issue 59). DeepSeek-V4's routed experts are
// most of its bytes (the released V4-Flash: about 140 of its 149 GiB), while
// a token reads only K of each layer's E. The placement plan decides at load
// which routed experts of which layers live on the device and which stay in
// host memory, held by a second backend (ExpertPlacement.Host: the engine
// gives backend/cpu); a layer with host experts routes on the host, runs its
// device experts on the device and its host experts on the host backend (the
// rows they take read back from the device, their outputs written back),
// and adds every expert's output in expert order, as the device's host path
// does. The host experts' weights are uploaded to the host backend only.

// ExpertPlacement chooses where the routed experts live (DeepSeek-V4).
// The zero value is the automatic plan.
type ExpertPlacement struct {
	// Mode is "auto" (or ""): from the device's free memory once the other
	// weights are loaded, less a session's caches (Context positions) and
	// Reserve, as many experts on the device as fit (everything on a
	// backend that does not report its free memory, such as the CPU);
	// "device": all on the device; "host": all on the host; "count": Count
	// experts on the device; "budget": as many as Budget bytes hold. The
	// device experts fill whole layers from the first (so that every layer
	// but one has all its experts on one side), the lowest experts of the
	// one layer split.
	Mode string
	// Count is the routed experts (summed over the layers) on the device
	// with Mode "count".
	Count int
	// Budget is the device bytes the routed experts may take with Mode
	// "budget".
	Budget int64
	// Context is the positions of the session whose caches the automatic
	// plan leaves room for (0: DefaultPlanContext).
	Context int
	// Reserve is device memory the automatic plan leaves free beyond the
	// caches, for scratch and fragmentation (0: DefaultPlanReserve).
	Reserve int64
	// DeviceBandwidth and HostBandwidth (bytes/s) price the plan's expected
	// cost per token at load (0: DefaultDeviceBandwidth,
	// DefaultHostBandwidth). They change no result.
	DeviceBandwidth, HostBandwidth float64
	// Host is the backend that holds and runs the host-resident experts
	// (backend/cpu). A plan that puts an expert on the host without it is
	// an error.
	Host backend.Backend
}

// Defaults of ExpertPlacement.
const (
	DefaultPlanContext     = 4096
	DefaultPlanReserve     = 1 << 30
	DefaultDeviceBandwidth = 3.35e12 // H100 SXM HBM3
	DefaultHostBandwidth   = 1e11    // a two-socket server's DDR5, roughly
)

// ErrPlacement is wrapped by the errors of a bad ExpertPlacement.
var ErrPlacement = errors.New("bad expert placement")

// validate checks what needs no model: the mode and the signs.
func (o ExpertPlacement) validate() error {
	switch o.Mode {
	case "", "auto", "device", "host", "count", "budget":
	default:
		return fmt.Errorf("%w: mode %q: want auto, device, host, count or budget", ErrPlacement, o.Mode)
	}
	if o.Count < 0 || o.Budget < 0 || o.Context < 0 || o.Reserve < 0 || o.DeviceBandwidth < 0 || o.HostBandwidth < 0 {
		return fmt.Errorf("%w: count %d, budget %d, context %d, reserve %d, bandwidths %g and %g: want none negative",
			ErrPlacement, o.Count, o.Budget, o.Context, o.Reserve, o.DeviceBandwidth, o.HostBandwidth)
	}
	return nil
}

// offloads reports whether o asks for experts in host memory explicitly.
func (o ExpertPlacement) offloads() bool {
	return o.Mode == "host" || o.Mode == "count" || o.Mode == "budget"
}

// ExpertPlan is where a model's routed experts live and what a token is
// expected to cost for it.
type ExpertPlan struct {
	// Device is, per decoder layer, how many of its routed experts live on
	// the device: experts [0, Device[i]); the rest are on the host.
	Device []int
	// Experts is the routed experts of each layer and TopK those a token
	// takes in each.
	Experts, TopK int
	// ExpertBytes is the stored bytes of one routed expert of each layer.
	ExpertBytes []int64
	// DenseBytes is the weights other than the routed experts, EmbedBytes
	// the embedding table among them (a token reads one row of it, when the
	// model has its own output head).
	DenseBytes, EmbedBytes int64
	// FreeBytes is the device's free memory before the experts were
	// uploaded (-1: the backend does not say); CacheBytes the caches the
	// automatic plan left room for.
	FreeBytes, CacheBytes int64
	// DeviceBandwidth and HostBandwidth are the rates the cost assumes.
	DeviceBandwidth, HostBandwidth float64
}

// DeviceExperts and HostExperts are the routed experts on each side, summed
// over the layers.
func (p *ExpertPlan) DeviceExperts() int {
	n := 0
	for _, d := range p.Device {
		n += d
	}
	return n
}

// HostExperts is the routed experts in host memory.
func (p *ExpertPlan) HostExperts() int { return p.Experts*len(p.Device) - p.DeviceExperts() }

// ExpertBytesOn is the bytes of the routed experts on the device (host
// false: on the host).
func (p *ExpertPlan) ExpertBytesOn(host bool) int64 {
	var n int64
	for i, d := range p.Device {
		if host {
			d = p.Experts - d
		}
		n += int64(d) * p.ExpertBytes[i]
	}
	return n
}

// TokenBytes is the bytes a decode token is expected to read from device
// memory (the dense weights and its routed experts there) and from host
// memory (its routed experts there), each layer's K experts taken uniformly.
func (p *ExpertPlan) TokenBytes() (device, host float64) {
	device = float64(p.DenseBytes - p.EmbedBytes)
	if p.Experts == 0 {
		return device, 0
	}
	for i, d := range p.Device {
		per := float64(p.TopK) * float64(p.ExpertBytes[i]) / float64(p.Experts)
		device += per * float64(d)
		host += per * float64(p.Experts-d)
	}
	return device, host
}

// TokenSeconds is the plan's floor for a decode token: its device bytes at
// DeviceBandwidth plus its host bytes at HostBandwidth (the CPU reads the
// host experts).
func (p *ExpertPlan) TokenSeconds() float64 {
	d, h := p.TokenBytes()
	return d/p.DeviceBandwidth + h/p.HostBandwidth
}

// String is the load note: the split and its expected cost per token.
func (p *ExpertPlan) String() string {
	d, h := p.TokenBytes()
	s := fmt.Sprintf("routed experts: %d on the device (%s), %d on the host (%s); dense weights %s",
		p.DeviceExperts(), sizeOf(float64(p.ExpertBytesOn(false))), p.HostExperts(), sizeOf(float64(p.ExpertBytesOn(true))), sizeOf(float64(p.DenseBytes)))
	if p.FreeBytes >= 0 {
		s += fmt.Sprintf(", %s free before the experts, %s kept for a session's caches", sizeOf(float64(p.FreeBytes)), sizeOf(float64(p.CacheBytes)))
	}
	t := p.TokenSeconds()
	return s + fmt.Sprintf("; a decode token reads %s on the device at %.0f GB/s + %s on the host at %.0f GB/s: %.3f ms, at most %.1f tokens/s",
		sizeOf(d), p.DeviceBandwidth/1e9, sizeOf(h), p.HostBandwidth/1e9, t*1e3, 1/t)
}

// sizeOf writes a byte count in GiB, or MiB below one GiB.
func sizeOf(n float64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", n/(1<<30))
	}
	return fmt.Sprintf("%.2f MiB", n/(1<<20))
}

// planExperts fills p.Device by o over layers of E experts whose bytes are
// p.ExpertBytes; free is the device's free memory after the other weights
// (-1: unknown) and cache what a session's caches take.
func planExperts(o ExpertPlacement, p *ExpertPlan, free, cache int64) error {
	L, E := len(p.ExpertBytes), p.Experts
	p.Device = make([]int, L)
	p.FreeBytes, p.CacheBytes = free, 0
	p.DeviceBandwidth, p.HostBandwidth = o.DeviceBandwidth, o.HostBandwidth
	if p.DeviceBandwidth == 0 {
		p.DeviceBandwidth = DefaultDeviceBandwidth
	}
	if p.HostBandwidth == 0 {
		p.HostBandwidth = DefaultHostBandwidth
	}
	if p.DeviceBandwidth < 0 || p.HostBandwidth < 0 {
		return fmt.Errorf("%w: bandwidths %g and %g bytes/s: want positive", ErrPlacement, o.DeviceBandwidth, o.HostBandwidth)
	}
	all := func() {
		for i := range p.Device {
			p.Device[i] = E
		}
	}
	// byCount puts the first n experts (layer by layer) on the device.
	byCount := func(n int) {
		for i := range p.Device {
			p.Device[i] = min(n, E)
			n -= p.Device[i]
		}
	}
	// byBytes puts on the device the longest run of experts (layer by
	// layer) whose bytes fit budget.
	byBytes := func(budget int64) {
		for i := range p.Device {
			if b := p.ExpertBytes[i]; b > 0 {
				p.Device[i] = int(min(int64(E), max(0, budget)/b))
			} else {
				p.Device[i] = E
			}
			budget -= int64(p.Device[i]) * p.ExpertBytes[i]
			if p.Device[i] < E {
				budget = 0 // later layers stay on the host: whole layers first
			}
		}
	}
	switch o.Mode {
	case "", "auto":
		if o.Context < 0 || o.Reserve < 0 {
			return fmt.Errorf("%w: auto: context %d, reserve %d: want >= 0", ErrPlacement, o.Context, o.Reserve)
		}
		if free < 0 {
			all()
			break
		}
		reserve := o.Reserve
		if reserve == 0 {
			reserve = DefaultPlanReserve
		}
		p.CacheBytes = cache
		byBytes(free - cache - reserve)
	case "device":
		all()
	case "host":
	case "count":
		if o.Count < 0 || o.Count > L*E {
			return fmt.Errorf("%w: count %d: want 0 to %d (%d layers of %d routed experts)", ErrPlacement, o.Count, L*E, L, E)
		}
		byCount(o.Count)
	case "budget":
		if o.Budget < 0 {
			return fmt.Errorf("%w: budget %d bytes: want >= 0", ErrPlacement, o.Budget)
		}
		byBytes(o.Budget)
	default:
		return fmt.Errorf("%w: mode %q: want auto, device, host, count or budget", ErrPlacement, o.Mode)
	}
	return nil
}

// routedExpertRE matches a routed expert's tensors of a decoder layer, in
// the released names (layers.N.ffn.experts.E.) and transformers' (fused or
// not).
var routedExpertRE = regexp.MustCompile(`^(?:model\.)?layers\.(\d+)\.(?:ffn|mlp)\.experts\.`)

// expertBytes sums the checkpoint's stored bytes: those of each decoder
// layer's routed experts (of layers layers) and the rest (the MTP block's
// only when mtp is set), and of the embedding table where a separate output
// head is stored (so a token reads one row of it).
func expertBytes(l *Loader, layers int, mtp bool) (perLayer []int64, dense, embed int64, err error) {
	perLayer = make([]int64, layers)
	head := l.Has("head.weight") || l.Has("lm_head.weight")
	for _, name := range l.ck.Names() {
		t, err := l.ck.Tensor(name)
		if err != nil {
			return nil, 0, 0, err
		}
		n := int64(len(t.Data))
		if m := routedExpertRE.FindStringSubmatch(name); m != nil {
			if i, err := strconv.Atoi(m[1]); err == nil && i < layers {
				perLayer[i] += n
				continue
			}
		}
		if !mtp && strings.HasPrefix(name, "mtp.") {
			continue
		}
		dense += n
		if head && (name == "embed.weight" || name == "model.embed_tokens.weight") {
			embed += n
		}
	}
	return perLayer, dense, embed, nil
}

// freeMemory is the backend's free memory, or -1 when it does not say.
func freeMemory(b backend.Backend) int64 {
	if f, ok := b.(interface{ FreeMemoryBytes() int64 }); ok {
		if n := f.FreeMemoryBytes(); n > 0 {
			return n
		}
	}
	return -1
}

// ExpertPlanner is implemented by models that place routed experts on the
// device or the host (DeepSeek-V4).
type ExpertPlanner interface {
	// ExpertPlan is the placement made at load.
	ExpertPlan() *ExpertPlan
}

// ExpertPlan is the placement of the routed experts made at load.
func (m *DeepseekV4) ExpertPlan() *ExpertPlan { return m.plan }

// planV4 makes the model's placement once its other weights are loaded.
func (m *DeepseekV4) planV4(l *Loader, o ExpertPlacement, mtp bool) error {
	per, dense, embed, err := expertBytes(l, len(m.blocks), mtp && m.mtp != nil)
	if err != nil {
		return err
	}
	E := m.v.NRoutedExperts
	p := &ExpertPlan{Experts: E, TopK: m.v.NumExpertsPerTok, ExpertBytes: make([]int64, len(per)), DenseBytes: dense, EmbedBytes: embed}
	for i, b := range per {
		p.ExpertBytes[i] = b / int64(max(E, 1))
	}
	ctx := o.Context
	if ctx == 0 {
		ctx = DefaultPlanContext
	}
	if err := planExperts(o, p, freeMemory(m.b), m.StateBytes(max(ctx, 1))); err != nil {
		return fmt.Errorf("model: %s: %w", m.cfg.Path, err)
	}
	if p.HostExperts() > 0 {
		if o.Host == nil {
			return fmt.Errorf("model: %s: %w: the plan puts %d routed experts on the host and no host backend is given (ExpertPlacement.Host)", m.cfg.Path, ErrPlacement, p.HostExperts())
		}
		if _, ok := o.Host.(interface{ FreeMemoryBytes() int64 }); ok {
			// A device backend as the host would take device memory.
			if freeMemory(o.Host) >= 0 {
				return fmt.Errorf("model: %s: %w: host backend %s is a device backend", m.cfg.Path, ErrPlacement, o.Host.Name())
			}
		}
		m.host = o.Host
		m.hostLoader = &Loader{b: o.Host, ck: l.ck, caps: backend.CapabilitiesOf(o.Host), rename: l.rename, fp8Block: l.fp8Block}
	}
	m.plan = p
	return nil
}

// v4HostScratch is a state's scratch for the host experts: buffers on the
// host backend and the host staging of the rows crossing between them.
type v4HostScratch struct {
	h, xe, ge, ue, ye backend.Buffer // on the host backend
	in, out           []float32      // h read back; the host experts' outputs, [rows, hidden] each
	outDev            backend.Buffer // the outputs written back to the device ([n*K, hidden])
}

// growHost sizes s for passes of n rows.
func (m *DeepseekV4) growHost(s *v4HostScratch, n int) {
	if m.host == nil {
		return
	}
	hb, D, I, K := m.host, m.cfg.HiddenSize, m.v.MoEIntermediateSize, m.v.NumExpertsPerTok
	s.h, s.xe, s.ye = hb.NewBuffer(n*D), hb.NewBuffer(n*D), hb.NewBuffer(n*D)
	s.ge, s.ue = hb.NewBuffer(n*I), hb.NewBuffer(n*I)
	s.in, s.out = make([]float32, n*D), make([]float32, n*K*D)
	s.outDev = m.b.NewBuffer(n * K * D)
}

// hostStateBytes is the device bytes growHost takes for passes of rows.
func (m *DeepseekV4) hostStateBytes(rows int) int64 {
	if m.host == nil {
		return 0
	}
	return 4 * int64(rows) * int64(m.v.NumExpertsPerTok) * int64(m.cfg.HiddenSize)
}

// runHostExperts computes the experts [first, E) of blk picked by s's rows
// on the host backend from s.host.in (the pass's n rows of h, read back from
// the device) and writes their outputs to s.host.outDev, expert after
// expert; it returns each expert's first row there (off[e-first]).
func (m *DeepseekV4) runHostExperts(s *v4State, blk *v4Block, n, first int, limit float32) []int {
	hb, hs, D, I := m.host, &s.host, m.cfg.HiddenSize, m.v.MoEIntermediateSize
	off := s.hostOff[:0]
	hb.Write(hs.h, 0, hs.in[:n*D])
	rows := 0
	for e := first; e < len(s.expRows); e++ {
		off = append(off, rows)
		cnt := len(s.expRows[e])
		if cnt == 0 {
			continue
		}
		xe := hb.View(hs.h, 0, n*D)
		if n > 1 {
			xe = hb.View(hs.xe, 0, cnt*D)
			hb.GatherRows(xe, hs.h, s.expRows[e], D)
		}
		ge, ue, ye := hb.View(hs.ge, 0, cnt*I), hb.View(hs.ue, 0, cnt*I), hb.View(hs.ye, 0, cnt*D)
		blk.Experts[e].forward(hb, ye, ge, ue, xe, cnt, limit)
		hb.Read(hs.out[rows*D:(rows+cnt)*D], ye, 0)
		rows += cnt
	}
	if rows > 0 {
		m.b.Write(hs.outDev, 0, hs.out[:rows*D])
	}
	s.hostOff = off
	return off
}
