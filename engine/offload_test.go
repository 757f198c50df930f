package engine

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/model"
)

// TestExpertsOffloaded loads the DeepSeek-V4 fixture with half of its
// routed experts (and with all of them) in host memory, run by a CPU
// backend, and compares the prompt's logits and 8 greedy tokens with the
// all-device model's: on the CPU, and on the GPU when there is one (logits
// within 2e-2: the GPU's experts sum in other orders than the CPU's).
func TestExpertsOffloaded(t *testing.T) {
	dir := golden.Path(t, "deepseek_v4")
	ref := golden.Load(t, dir)
	prompt := ints(ref.InputIDs[:min(20, len(ref.InputIDs))])
	devices := testDevices()
	mtpDir := withMTP(t, dir, 1)
	run := func(device string, place model.ExpertPlacement, spec ...SpeculativeOptions) ([]float32, []int, *model.ExpertPlan) {
		o, d := Options{Device: device, Experts: place}, dir
		if len(spec) > 0 {
			o.Speculative, d = spec[0], mtpDir
		}
		m, s := openSession(t, d, o)
		logits, err := s.Append(context.Background(), prompt)
		if err != nil {
			t.Fatal(err)
		}
		s.Truncate(0)
		res, err := s.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 8, StopTokens: []int{}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(spec) > 0 && m.SpeculativeStats().Drafted == 0 {
			t.Errorf("%s %+v: no token drafted", device, place)
		}
		return logits, res.Tokens, m.ExpertPlan()
	}
	for _, device := range devices {
		want, wantToks, _ := run(device, model.ExpertPlacement{Mode: "device"})
		for _, place := range []model.ExpertPlacement{{Mode: "count", Count: 16}, {Mode: "host"}} {
			got, toks, plan := run(device, place)
			if plan == nil || plan.HostExperts() == 0 {
				t.Fatalf("%s %+v: plan %v puts no expert on the host", device, place, plan)
			}
			var worst float64
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i])))
			}
			tol := 2e-2
			if device == "cpu" {
				tol = 1e-5
			}
			if worst > tol {
				t.Errorf("%s %s %d: max |logit diff| %g against all on the device, want <= %g", device, place.Mode, place.Count, worst, tol)
			}
			for i := range wantToks {
				if i >= len(toks) || toks[i] != wantToks[i] {
					t.Errorf("%s %s %d: greedy %v, want %v", device, place.Mode, place.Count, toks, wantToks)
					break
				}
			}
			if _, specToks, _ := run(device, place, SpeculativeOptions{Mode: "on", Tokens: 2}); !slices.Equal(specToks, toks) {
				t.Errorf("%s %s %d: greedy with MTP drafts %v, without %v", device, place.Mode, place.Count, specToks, toks)
			}
			t.Logf("%s, %d of %d experts on the host: max |logit diff| %g; %s", device, plan.HostExperts(), plan.HostExperts()+plan.DeviceExperts(), worst, plan)
		}
	}
}
