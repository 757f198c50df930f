package engine

import (
	"reflect"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// TestInfo checks Model.Info against what testmodel writes: the same
// parameters in BF16 and in NVFP4 (codes counted two a byte, scales not),
// the bytes of each dtype, and the figures of the config and the session.
func TestInfo(t *testing.T) {
	const L, H, F, heads, kv, V, hd = 2, 64, 96, 4, 2, 100, 16
	params := int64(2*V*H + H + L*(2*H+H*heads*hd+2*H*kv*hd+heads*hd*H+3*H*F))
	linear := int64(L * (H*heads*hd + 2*H*kv*hd + heads*hd*H + 3*H*F))
	for _, tc := range []struct {
		nvfp4 bool
		bytes map[string]int64
		quant string
	}{
		{false, map[string]int64{"BF16": 2 * params}, ""},
		{true, map[string]int64{"BF16": 2 * (params - linear), "U8": linear / 2, "F8_E4M3": linear / 16, "F32": 4 * L * 7}, "NVFP4"},
	} {
		spec := testmodel.Llama{Layers: L, Hidden: H, FFN: F, Heads: heads, KVHeads: kv, Vocab: V, DType: weights.BF16, NVFP4: tc.nvfp4, Seed: 3}
		dir := testmodel.WriteTemp(t, spec)
		m, err := Load(dir, Options{Device: "cpu", ContextLength: 32})
		if err != nil {
			t.Fatal(err)
		}
		in := m.Info()
		want := Info{Architecture: "llama", Parameters: params, BytesByDType: tc.bytes, CheckpointBytes: spec.CheckpointBytes(),
			Quantization: tc.quant, VocabSize: V, Layers: L, HiddenSize: H, MaxPositions: 40960, ContextLength: 32,
			Device: m.Device(), CacheBytesPerToken: 2 * L * kv * hd * 4}
		if !reflect.DeepEqual(in, want) {
			t.Errorf("NVFP4 %v:\n got %+v\nwant %+v %v", tc.nvfp4, in, want, tc.bytes)
		}
		if !strings.HasPrefix(in.Device, "cpu") {
			t.Errorf("device %q", in.Device)
		}
		s, err := m.NewSession(0)
		if err != nil {
			t.Fatal(err)
		}
		if s.CacheBytes() != 32*in.CacheBytesPerToken {
			t.Errorf("a session of 32 positions holds %d bytes, Info says %d a position", s.CacheBytes(), in.CacheBytesPerToken)
		}
		in.BytesByDType["BF16"] = -1 // the caller's copy
		m.Close()
		if after := m.Info(); after.Parameters != params || after.BytesByDType["BF16"] == -1 || after.CacheBytesPerToken != 0 {
			t.Errorf("Info after Close: %+v", after)
		}
	}
}
