package model

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend"
	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/internal/testmodel"
)

// TestPlanExperts holds the plan's arithmetic: modes and budgets to the
// experts of each layer on the device, bad options to ErrPlacement.
func TestPlanExperts(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name       string
		o          ExpertPlacement
		free       int64
		want       []int // device experts per layer (3 layers of 4, 100 bytes each)
		wantErr    bool
		hostBytes  int64
		tokenHostB float64
	}{
		{name: "auto unknown free: all device", o: ExpertPlacement{}, free: -1, want: []int{4, 4, 4}},
		{name: "auto fits all", o: ExpertPlacement{Reserve: 10}, free: 10 + 50 + 1200, want: []int{4, 4, 4}},
		{name: "auto fits 6", o: ExpertPlacement{Mode: "auto", Reserve: 10}, free: 10 + 50 + 650, want: []int{4, 2, 0}, hostBytes: 600, tokenHostB: 300},
		{name: "auto nothing fits", o: ExpertPlacement{Reserve: 10}, free: 20, want: []int{0, 0, 0}, hostBytes: 1200},
		{name: "auto default reserve", o: ExpertPlacement{}, free: gib + 50 + 399, want: []int{3, 0, 0}},
		{name: "device", o: ExpertPlacement{Mode: "device"}, free: 0, want: []int{4, 4, 4}},
		{name: "host", o: ExpertPlacement{Mode: "host"}, free: -1, want: []int{0, 0, 0}, hostBytes: 1200, tokenHostB: 600},
		{name: "count 5", o: ExpertPlacement{Mode: "count", Count: 5}, want: []int{4, 1, 0}},
		{name: "count all", o: ExpertPlacement{Mode: "count", Count: 12}, want: []int{4, 4, 4}},
		{name: "budget 999", o: ExpertPlacement{Mode: "budget", Budget: 999}, want: []int{4, 4, 1}},
		{name: "budget 0", o: ExpertPlacement{Mode: "budget"}, want: []int{0, 0, 0}},
		{name: "bad mode", o: ExpertPlacement{Mode: "gpu"}, wantErr: true},
		{name: "count negative", o: ExpertPlacement{Mode: "count", Count: -1}, wantErr: true},
		{name: "count too many", o: ExpertPlacement{Mode: "count", Count: 13}, wantErr: true},
		{name: "budget negative", o: ExpertPlacement{Mode: "budget", Budget: -1}, wantErr: true},
		{name: "reserve negative", o: ExpertPlacement{Reserve: -1}, free: gib, wantErr: true},
		{name: "bandwidth negative", o: ExpertPlacement{Mode: "device", HostBandwidth: -1}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &ExpertPlan{Experts: 4, TopK: 2, ExpertBytes: []int64{100, 100, 100}, DenseBytes: 1000}
			err := planExperts(tc.o, p, tc.free, 50)
			if tc.wantErr {
				if !errors.Is(err, ErrPlacement) {
					t.Fatalf("err = %v, want ErrPlacement", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.Device, tc.want) {
				t.Fatalf("device experts %v, want %v", p.Device, tc.want)
			}
			if got := p.ExpertBytesOn(true); got != tc.hostBytes && tc.hostBytes != 0 {
				t.Errorf("host bytes %d, want %d", got, tc.hostBytes)
			}
			d, h := p.TokenBytes()
			if d+h != 1000+600 {
				t.Errorf("token bytes %g + %g, want 1600 in all", d, h)
			}
			if tc.tokenHostB != 0 && h != tc.tokenHostB {
				t.Errorf("token host bytes %g, want %g", h, tc.tokenHostB)
			}
			if want := d/DefaultDeviceBandwidth + h/DefaultHostBandwidth; p.TokenSeconds() != want {
				t.Errorf("token seconds %g, want %g", p.TokenSeconds(), want)
			}
			if p.String() == "" {
				t.Error("empty plan note")
			}
			p.EmbedBytes = 400 // a token reads one row of it: not in its bytes
			if d2, _ := p.TokenBytes(); d2 != d-400 {
				t.Errorf("token device bytes %g with a 400-byte embedding, want %g", d2, d-400)
			}
		})
	}
}

// countingCPU is a CPU backend that counts the weights uploaded to it.
type countingCPU struct {
	*cpu.Backend
	uploads int
}

func (c *countingCPU) Upload(w *backend.HostWeight) (backend.Weight, error) {
	c.uploads++
	return c.Backend.Upload(w)
}

// buildV4Placed builds the V4 checkpoint in dir on a CPU backend with the
// placement o, a second CPU backend standing in for the host.
func buildV4Placed(t testing.TB, dir string, o ExpertPlacement) *DeepseekV4 {
	t.Helper()
	f, err := ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if o.Host == nil {
		o.Host = &countingCPU{Backend: cpu.New(0)}
	}
	m, err := Build(&countingCPU{Backend: cpu.New(0)}, f, Options{Experts: o})
	if err != nil {
		t.Fatal(err)
	}
	return m.(*DeepseekV4)
}

// runV4 runs a prompt (all logits) and steps greedy decode tokens, returning
// every logit row and the greedy tokens.
func runV4(t testing.TB, m *DeepseekV4, prompt []int32, steps int) ([]float32, []int32) {
	t.Helper()
	st, err := m.NewState(len(prompt) + steps + 1)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward(context.Background(), st, prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	all := slices.Clone(logits)
	V := m.cfg.VocabSize
	var toks []int32
	last := logits[len(logits)-V:]
	for range steps {
		tok := int32(argmax(last))
		toks = append(toks, tok)
		if last, err = m.Forward(context.Background(), st, []int32{tok}, false); err != nil {
			t.Fatal(err)
		}
		all = append(all, last...)
	}
	return all, toks
}

// TestV4OffloadMatchesDevice: a model whose plan puts some or all routed
// experts on the host (a second CPU backend) gives the all-device logits
// and greedy tokens, on random tiny V4 checkpoints in the released formats
// and on the V4 golden fixture; the host experts' weights are on the host
// backend only.
func TestV4OffloadMatchesDevice(t *testing.T) {
	dirs := map[string]string{"golden": golden.Path(t, "deepseek_v4")}
	for _, format := range []string{testmodel.V4FP8MXFP4, testmodel.V4FP8NVFP4} {
		dirs[format] = writeReleased(t, format)
	}
	for name, dir := range dirs {
		ref := buildV4Placed(t, dir, ExpertPlacement{Mode: "device"})
		refUploads := ref.b.(*countingCPU).uploads
		if p, total := ref.ExpertPlan(), checkpointBytes(t, dir); p.DenseBytes+p.ExpertBytesOn(false)+p.ExpertBytesOn(true) != total || p.EmbedBytes <= 0 {
			t.Errorf("%s: plan of %d dense (%d embedding) and %d expert bytes, checkpoint %d bytes", name, p.DenseBytes, p.EmbedBytes, p.ExpertBytesOn(false), total)
		}
		L, E := len(ref.blocks), ref.v.NRoutedExperts
		rng := rand.New(rand.NewPCG(5, 9))
		prompt := randTokens(rng, 11, ref.cfg.VocabSize)
		want, wantToks := runV4(t, ref, prompt, 6)
		for _, count := range []int{0, 1, E + E/2, L*E - 1} {
			host := &countingCPU{Backend: cpu.New(0)}
			m := buildV4Placed(t, dir, ExpertPlacement{Mode: "count", Count: count, Host: host})
			p := m.ExpertPlan()
			if p.DeviceExperts() != count || p.HostExperts() != L*E-count {
				t.Fatalf("%s count %d: plan %d on the device, %d on the host", name, count, p.DeviceExperts(), p.HostExperts())
			}
			if hw := host.uploads; hw != 3*(L*E-count) {
				t.Errorf("%s count %d: %d weights uploaded to the host backend, want %d", name, count, hw, 3*(L*E-count))
			}
			if dw := m.b.(*countingCPU).uploads; dw != refUploads-3*(L*E-count) {
				t.Errorf("%s count %d: %d weights uploaded to the device backend, want %d", name, count, dw, refUploads-3*(L*E-count))
			}
			for i := range m.blocks {
				if m.blocks[i].host != E-p.Device[i] {
					t.Fatalf("%s count %d layer %d: %d experts on the host, plan %d", name, count, i, m.blocks[i].host, E-p.Device[i])
				}
			}
			got, toks := runV4(t, m, prompt, 6)
			if !slices.Equal(toks, wantToks) {
				t.Errorf("%s count %d: greedy %v, want %v", name, count, toks, wantToks)
			}
			var worst float64
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i])))
			}
			if worst > 1e-4 {
				t.Errorf("%s count %d: max |logit diff| %g", name, count, worst)
			}
			t.Logf("%s: %d of %d experts on the host: max |logit diff| %g; %s", name, L*E-count, L*E, worst, p)
		}
	}
}

// TestExpertsOtherArchitectures: a placement that asks for host experts
// is an error on an architecture that keeps every weight on the device; the
// automatic one and "device" are not.
func TestExpertsOtherArchitectures(t *testing.T) {
	f, err := ReadFolder(golden.Path(t, "llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, o := range []ExpertPlacement{{}, {Mode: "device"}, {Mode: "host", Host: cpu.New(1)}} {
		_, err := Build(cpu.New(1), f, Options{Experts: o})
		if o.offloads() != errors.Is(err, ErrPlacement) {
			t.Errorf("%q: err = %v", o.Mode, err)
		}
	}
}

// checkpointBytes is the stored bytes of the checkpoint in dir but its MTP
// block's.
func checkpointBytes(t *testing.T, dir string) int64 {
	f, err := ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	for _, name := range f.Checkpoint.Names() {
		if strings.HasPrefix(name, "mtp.") {
			continue
		}
		tn, err := f.Checkpoint.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		n += int64(len(tn.Data))
	}
	return n
}

// TestV4OffloadErrors: a plan with host experts and no host backend, and bad
// options, are errors naming the placement.
func TestV4OffloadErrors(t *testing.T) {
	dir := writeReleased(t, testmodel.V4FP8MXFP4)
	f, err := ReadFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, o := range []ExpertPlacement{
		{Mode: "host"},
		{Mode: "count", Count: 1},
		{Mode: "count", Count: 1 << 20, Host: cpu.New(1)},
		{Mode: "nowhere", Host: cpu.New(1)},
		{Mode: "budget", Budget: -5, Host: cpu.New(1)},
		{Reserve: -1, Host: cpu.New(1)},
	} {
		if _, err := Build(cpu.New(1), f, Options{Experts: o}); !errors.Is(err, ErrPlacement) {
			t.Errorf("%+v: err = %v, want ErrPlacement", o, err)
		}
	}
}

// BenchmarkV4OffloadDecode times a decode step of the tiny released V4 on
// the CPU with its routed experts on the "device" (a CPU backend) and on the
// host (a second one): the cost of the round trip (rows read back, outputs
// written back) and of routing on the host.
func BenchmarkV4OffloadDecode(b *testing.B) {
	d := tinyReleasedV4
	d.Released = testmodel.V4FP8NVFP4
	dir := b.TempDir()
	if err := d.Write(dir); err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"device", "host"} {
		b.Run(mode, func(b *testing.B) {
			m := buildV4Placed(b, dir, ExpertPlacement{Mode: mode})
			st, err := m.NewState(b.N + 9)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if _, err := m.Forward(ctx, st, []int32{1, 2, 3, 4, 5, 6, 7, 8}, false); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if _, err := m.Forward(ctx, st, []int32{int32(i % 300)}, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
