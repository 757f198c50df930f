package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/testmodel"
	"github.com/manifoldlm/manifold/weights"
)

// chatTemplate is a ChatML template, as Qwen's.
const chatTemplate = `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}`

// writeTextModel writes a small random Qwen3 whose tokenizer has a token
// for each printable ASCII character and newline, and ChatML's special
// tokens (<|im_end|>, id 1, is the EOS).
func writeTextModel(t testing.TB, dir string) {
	t.Helper()
	specials := []string{"<|endoftext|>", "<|im_end|>", "<|im_start|>"}
	vocab := map[string]int{}
	var added []map[string]any
	for i, s := range specials {
		vocab[s] = i
		added = append(added, map[string]any{"id": i, "content": s, "special": true})
	}
	chars := "\n"
	for c := ' '; c <= '~'; c++ {
		chars += string(c)
	}
	for _, c := range chars {
		vocab[string(c)] = len(vocab)
	}
	tj, err := json.Marshal(map[string]any{"normalizer": nil, "pre_tokenizer": nil, "post_processor": nil,
		"decoder": map[string]any{"type": "Fuse"}, "added_tokens": added,
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{}}})
	if err != nil {
		t.Fatal(err)
	}
	tc, _ := json.Marshal(map[string]any{"chat_template": chatTemplate, "eos_token": "<|im_end|>"})
	spec := testmodel.Llama{Layers: 2, Hidden: 64, FFN: 128, Heads: 4, KVHeads: 2, Vocab: len(vocab), DType: weights.BF16, Qwen3: true, Seed: 21}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := spec.Write(dir); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tokenizer.json": tj, "tokenizer_config.json": tc} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// testServer serves a fresh text model from an httptest server.
type testServer struct {
	*server
	url  string
	http *httptest.Server
}

func newTestServer(t testing.TB, sessions, queue int) *testServer {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	writeTextModel(t, dir)
	m, err := engine.Load(dir, engine.Options{Device: "cpu", Threads: 2, ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := m.NewPool(engine.PoolOptions{Sessions: sessions, MaxQueue: queue})
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(context.Background(), m, pool, "tiny")
	hs := httptest.NewServer(s.handler())
	t.Cleanup(func() { hs.Close(); pool.Close(); m.Close() })
	return &testServer{server: s, url: hs.URL, http: hs}
}

// post sends body (JSON-encoded unless a string) to path and returns the
// status and the body.
func (ts *testServer) post(t testing.TB, path string, body any) (int, []byte) {
	t.Helper()
	var data []byte
	if s, ok := body.(string); ok {
		data = []byte(s)
	} else {
		data, _ = json.Marshal(body)
	}
	resp, err := http.Post(ts.url+path, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (ts *testServer) get(t testing.TB, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(ts.url + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}
