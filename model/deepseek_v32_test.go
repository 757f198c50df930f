package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/internal/golden"
)

// v32Dirs lists the fixture folders (f32 and bf16) of deepseek_v32 models.
func v32Dirs(t *testing.T) []string {
	root := golden.Dir(t)
	var dirs []string
	for _, arch := range golden.Models(t) {
		for _, variant := range []string{"", "bf16"} {
			dir := filepath.Join(root, arch, variant)
			if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
				continue
			}
			if modelType(t, dir) == "deepseek_v32" {
				dirs = append(dirs, dir)
			}
		}
	}
	if len(dirs) == 0 {
		t.Skip("no deepseek_v32 fixtures")
	}
	return dirs
}

// loadV32 loads the fixture at dir with its config.json edited by edit (may be nil).
func loadV32(t testing.TB, dir string, edit func(map[string]any)) (*DeepseekV32, error) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		var raw map[string]any
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatal(err)
		}
		edit(raw)
		if data, err = json.Marshal(raw); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := ParseConfig(path, data)
	if err != nil {
		return nil, err
	}
	ck := openCheckpoint(t, dir)
	m, err := Build(cpu.New(0), &Folder{Dir: dir, Config: cfg, Checkpoint: ck}, Options{})
	if err != nil {
		return nil, err
	}
	return m.(*DeepseekV32), nil
}

// runV32 returns the full-sequence logits of ids and the incremental ones
// (prefill ids[:P], then one token at a time: rows for positions P-1..T-1).
func runV32(t *testing.T, m *DeepseekV32, path MLAPath, ids []int32, P int) (full, inc []float32) {
	return runLogits(t, m, func(n int) (State, error) { return m.NewStateWith(n, path) }, ids, P)
}

// runLogits is runV32 for any model, its states made by newState.
func runLogits(t *testing.T, m Model, newState func(capacity int) (State, error), ids []int32, P int) (full, inc []float32) {
	t.Helper()
	ctx := context.Background()
	st, err := newState(len(ids))
	if err != nil {
		t.Fatal(err)
	}
	if full, err = m.Forward(ctx, st, ids, true); err != nil {
		t.Fatal(err)
	}
	st, _ = newState(len(ids))
	last, err := m.Forward(ctx, st, ids[:P], false)
	if err != nil {
		t.Fatal(err)
	}
	inc = append(inc, last...)
	for p := P; p < len(ids); p++ {
		if last, err = m.Forward(ctx, st, ids[p:p+1], false); err != nil {
			t.Fatal(err)
		}
		inc = append(inc, last...)
	}
	return full, inc
}

// prefillLen is the P of the fixture's logits_incremental, from this folder
// or its f32 sibling (bf16 folders hold logits_full only); T/2 if neither has one.
func prefillLen(t *testing.T, dir string, ref *golden.Reference) int {
	T := len(ref.InputIDs)
	if ref.LogitsIncremental != nil {
		return T - ref.IncrementalRows + 1
	}
	parent := filepath.Dir(dir)
	if _, err := os.Stat(filepath.Join(parent, "golden.safetensors")); err == nil && filepath.Base(dir) == "bf16" {
		if pr := golden.Load(t, parent); pr.LogitsIncremental != nil && len(pr.InputIDs) == T {
			return T - pr.IncrementalRows + 1
		}
	}
	return T / 2
}

// TestDeepseekV32Paths runs every MLA path on every deepseek_v32 fixture
// (f32 and bf16): full and incremental logits against the golden ones, and
// the paths against each other.
func TestDeepseekV32Paths(t *testing.T) {
	root := golden.Dir(t)
	for _, dir := range v32Dirs(t) {
		name, _ := filepath.Rel(root, dir)
		t.Run(name, func(t *testing.T) {
			ref := golden.Load(t, dir)
			m, err := loadV32(t, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			T, V := len(ref.InputIDs), ref.Vocab
			P := prefillLen(t, dir, ref)
			wantInc := ref.LogitsIncremental
			if wantInc == nil { // row i of the incremental logits is position P-1+i
				wantInc = ref.LogitsFull[(P-1)*V : T*V]
			}
			var base []float32
			for _, path := range []MLAPath{MLAAuto, MLAAbsorbed, MLANaive} {
				full, inc := runV32(t, m, path, ref.InputIDs, P)
				if d := maxAbsDiff(full, ref.LogitsFull); d > goldenTol {
					t.Errorf("%v: logits_full max |diff| %.3g > %g", path, d, goldenTol)
				}
				if d := maxAbsDiff(inc, wantInc); d > goldenTol {
					t.Errorf("%v: logits_incremental (P=%d) max |diff| %.3g > %g", path, P, d, goldenTol)
				} else {
					t.Logf("%v: full %.3g, incremental (P=%d) %.3g", path, maxAbsDiff(full, ref.LogitsFull), P, d)
				}
				if base == nil {
					base = inc
				} else if d := maxAbsDiff(inc, base); d > 1e-4 {
					t.Errorf("%v vs %v incremental logits differ by %.3g", path, MLAAuto, d)
				}
			}
		})
	}
}

// TestDeepseekV32DenseWhenTopKCoversSequence sets index_topk to the sequence
// length: every query then selects all earlier tokens, and the sparse paths
// must give the logits of dense causal MLA (the backend's plain attention).
// With the fixture's own index_topk below the length, they must not.
func TestDeepseekV32DenseWhenTopKCoversSequence(t *testing.T) {
	dir := v32Dirs(t)[0]
	ref := golden.Load(t, dir)
	ids := ref.InputIDs
	T := len(ids)
	m, err := loadV32(t, dir, func(c map[string]any) { c["index_topk"] = T })
	if err != nil {
		t.Fatal(err)
	}
	dense, _ := runV32(t, m, MLADense, ids, T)
	for _, path := range []MLAPath{MLAAuto, MLAAbsorbed, MLANaive} {
		sparse, _ := runV32(t, m, path, ids, T)
		if d := maxAbsDiff(sparse, dense); d > 1e-4 {
			t.Errorf("index_topk %d >= %d tokens, %v: max |diff| to dense MLA %.3g", T, T, path, d)
		} else {
			t.Logf("index_topk %d >= %d tokens, %v vs dense: max |diff| %.3g", T, T, path, d)
		}
	}
	// Unmodified, an index_topk below T must change the logits.
	orig, err := loadV32(t, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k := orig.IndexerShape().TopK; k < T {
		sparse, _ := runV32(t, orig, MLAAuto, ids, T)
		dense, _ := runV32(t, orig, MLADense, ids, T)
		if d := maxAbsDiff(sparse, dense); d < 1e-3 {
			t.Errorf("index_topk %d < %d tokens but sparse attention equals dense (max |diff| %.3g)", k, T, d)
		} else {
			t.Logf("index_topk %d < %d tokens: sparse differs from dense by %.3g", k, T, d)
		}
	}
}

// TestDeepseekV32CacheBytes checks the cache memory per token against the
// formula stated from the config: the absorbed cache holds, per layer, the
// kv_lora_rank latent, the qk_rope_head_dim rope key and the index_head_dim
// indexer key; the naive one the expanded keys and values of every head.
func TestDeepseekV32CacheBytes(t *testing.T) {
	dir := v32Dirs(t)[0]
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Layers     int `json:"num_hidden_layers"`
		Heads      int `json:"num_attention_heads"`
		KVLora     int `json:"kv_lora_rank"`
		Rope       int `json:"qk_rope_head_dim"`
		Nope       int `json:"qk_nope_head_dim"`
		V          int `json:"v_head_dim"`
		IndexDim   int `json:"index_head_dim"`
		IndexHeads int `json:"index_n_heads"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	m, err := loadV32(t, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	const capacity = 64
	for _, tc := range []struct {
		path MLAPath
		want int64
	}{
		{MLAAuto, int64(c.Layers) * 4 * int64(c.KVLora+c.Rope+c.IndexDim)},
		{MLAAbsorbed, int64(c.Layers) * 4 * int64(c.KVLora+c.Rope+c.IndexDim)},
		{MLANaive, int64(c.Layers) * 4 * int64(c.Heads*(c.Nope+c.V)+c.Rope+c.IndexDim)},
	} {
		st, err := m.NewStateWith(capacity, tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CacheBytesPerToken(); got != tc.want {
			t.Errorf("%v: %d cache bytes per token, formula gives %d", tc.path, got, tc.want)
		}
		if got := st.CacheBytes(); got != tc.want*capacity {
			t.Errorf("%v: %d cache bytes for %d positions, want %d", tc.path, got, capacity, tc.want*capacity)
		}
		t.Logf("%v: %d bytes/token (%d layers)", tc.path, st.CacheBytesPerToken(), c.Layers)
	}
	st, _ := m.NewState(capacity)
	if p := st.(*v32State).Path(); p != MLAAuto {
		t.Errorf("NewState path %v, want %v", p, MLAAuto)
	}
	if !m.absorb(1, capacity) {
		t.Error("decoding one token does not take the absorbed path")
	}
}

func TestDeepseekV32ConfigErrors(t *testing.T) {
	dir := v32Dirs(t)[0]
	for _, tc := range []struct {
		name  string
		edit  func(map[string]any)
		field string
	}{
		{"q_lora_rank null", func(c map[string]any) { c["q_lora_rank"] = nil }, "q_lora_rank"},
		{"kv heads", func(c map[string]any) { c["num_key_value_heads"] = 1 }, "num_key_value_heads"},
		{"mlp_layer_types length", func(c map[string]any) { c["mlp_layer_types"] = []string{"dense"} }, "mlp_layer_types"},
		{"mlp_layer_types value", func(c map[string]any) {
			n := int(c["num_hidden_layers"].(float64))
			c["mlp_layer_types"] = append([]string{"moe"}, make([]string, n-1)...)
		}, "mlp_layer_types"},
		{"layer_types", func(c map[string]any) {
			n := int(c["num_hidden_layers"].(float64))
			lt := make([]string, n)
			for i := range lt {
				lt[i] = "full_attention"
			}
			c["layer_types"] = lt
		}, "layer_types"},
		{"n_group", func(c map[string]any) { c["n_group"] = 3; c["mlp_layer_types"] = nil; c["first_k_dense_replace"] = 0 }, "n_group"},
		{"index_topk", func(c map[string]any) { c["index_topk"] = 0 }, "index_"},
		{"rope dim odd", func(c map[string]any) { c["qk_rope_head_dim"] = 7 }, "attention dims"},
		{"hidden_act", func(c map[string]any) { c["hidden_act"] = "gelu" }, "hidden_act"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadV32(t, dir, tc.edit)
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q does not name %q as a config error", err, tc.field)
			}
		})
	}
	// A size the checkpoint disagrees with names the tensor.
	_, err := loadV32(t, dir, func(c map[string]any) { c["kv_lora_rank"] = c["kv_lora_rank"].(float64) + 2 })
	if err == nil || !strings.Contains(err.Error(), "kv_a_layernorm") && !strings.Contains(err.Error(), "kv_b_proj") && !strings.Contains(err.Error(), "kv_a_proj") {
		t.Fatalf("wrong kv_lora_rank: error %v does not name a tensor", err)
	}
}

// TestDeepseekV32ConcurrentStates decodes on two states of one model at once
// (run with -race to check that sessions share nothing mutable).
func TestDeepseekV32ConcurrentStates(t *testing.T) {
	dir := v32Dirs(t)[0]
	ref := golden.Load(t, dir)
	m, err := loadV32(t, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	T, V := len(ref.InputIDs), ref.Vocab
	errs := make(chan error, 2)
	for _, path := range []MLAPath{MLAAuto, MLANaive} {
		go func() {
			st, err := m.NewStateWith(T, path)
			if err != nil {
				errs <- err
				return
			}
			for p := range T {
				logits, err := m.Forward(context.Background(), st, ref.InputIDs[p:p+1], false)
				if err != nil {
					errs <- err
					return
				}
				if d := maxAbsDiff(logits, ref.LogitsFull[p*V:(p+1)*V]); d > goldenTol {
					errs <- fmt.Errorf("%v: position %d: max |diff| %.3g", path, p, d)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
