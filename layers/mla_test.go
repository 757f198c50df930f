package layers

import (
	"math"
	"testing"
)

func TestMLASoftmaxScale(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    RoPEParams
		dim  int
		want float64
	}{
		{"default", RoPEParams{Type: "default", Factor: 8, MscaleAllDim: 1}, 48, 1 / math.Sqrt(48)},
		{"empty type", RoPEParams{}, 192, 1 / math.Sqrt(192)},
		{"yarn without mscale_all_dim", RoPEParams{Type: "yarn", Factor: 40}, 192, 1 / math.Sqrt(192)},
		{"yarn factor 8", RoPEParams{Type: "yarn", Factor: 8, MscaleAllDim: 1}, 48,
			math.Pow(0.1*math.Log(8)+1, 2) / math.Sqrt(48)},
		{"yarn factor 40 mscale_all_dim 1 (DeepSeek-V3)", RoPEParams{Type: "yarn", Factor: 40, MscaleAllDim: 1}, 192,
			math.Pow(0.1*math.Log(40)+1, 2) / math.Sqrt(192)},
		{"factor below 1", RoPEParams{Type: "yarn", Factor: 0.5, MscaleAllDim: 1}, 64, 1.0 / 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MLASoftmaxScale(tc.dim, tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(float64(got)-tc.want) > 1e-7 {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	if _, err := MLASoftmaxScale(48, RoPEParams{Type: "yarn", MscaleAllDim: 1}); err == nil {
		t.Fatal("yarn without factor accepted")
	}
}

func TestMLAShape(t *testing.T) {
	s := MLAShape{Heads: 128, QLoraRank: 1536, KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.QKDim() != 192 {
		t.Fatalf("QKDim %d", s.QKDim())
	}
	// DeepSeek-V3.2: latent 512 + rope 64 + indexer key 128, float32.
	if got := MLACacheBytesPerToken(s, 128); got != 4*(512+64+128) {
		t.Fatalf("bytes per token %d", got)
	}
	for _, bad := range []MLAShape{
		{Heads: 0, QLoraRank: 1, KVLoraRank: 1, NopeDim: 1, RopeDim: 2, VDim: 1},
		{Heads: 1, QLoraRank: 1, KVLoraRank: 1, NopeDim: 1, RopeDim: 3, VDim: 1},
		{Heads: 1, QLoraRank: 1, KVLoraRank: 0, NopeDim: 1, RopeDim: 2, VDim: 1},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
