package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/manifoldlm/manifold/internal/serveload"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShutdown: on its context's end run refuses new requests and lets a
// request in flight finish within the grace, or cancels it past the grace,
// then returns.
func TestShutdown(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	writeTextModel(t, dir)
	for _, tc := range []struct {
		name      string
		grace     string
		maxTokens int
		wantDone  bool
	}{
		{"finishes", "10s", 40, true},
		{"cancelled", "20ms", 3000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			addr := make(chan string, 1)
			ended := make(chan error, 1)
			go func() {
				ended <- run(ctx, []string{"-model", dir, "-addr", "127.0.0.1:0", "-device", "cpu", "-ctx", "4096", "-sessions", "2",
					"-shutdown-grace", tc.grace}, io.Discard, func(a string) { addr <- a })
			}()
			url := "http://" + <-addr
			body, _ := json.Marshal(map[string]any{"model": "tiny", "prompt": "Hello", "max_tokens": tc.maxTokens, "temperature": 0, "stream": true})
			resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := true
			done, _ := serveload.Events(resp.Body, func(string) {
				if first { // in flight: shut down
					first = false
					stop()
					for {
						r, err := http.Get(url + "/health")
						if err != nil || r.StatusCode == 503 {
							break
						}
						r.Body.Close()
						time.Sleep(time.Millisecond)
					}
					if r, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body))); err == nil {
						if r.StatusCode != 503 {
							t.Errorf("a request during shutdown: %d", r.StatusCode)
						}
						r.Body.Close()
					}
				}
			})
			if done != tc.wantDone {
				t.Errorf("stream ended with [DONE]: %v, want %v", done, tc.wantDone)
			}
			select {
			case err := <-ended:
				if err != nil {
					t.Errorf("run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("run did not return")
			}
		})
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-sessions", "0"}, {"-queue", "-2"}, {"-ctx", "-1"}, {"extra"}, {"-nope"}} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	o, err := parseFlags([]string{"-model", "m", "-sessions", "4"}, io.Discard)
	if err != nil || o.model != "m" || o.sessions != 4 || o.addr != "127.0.0.1:8080" {
		t.Errorf("%+v, %v", o, err)
	}
}

// TestServeBuiltin serves the built-in model (a DeepSeek-V4, which does not
// batch: its sessions run alone, concurrently) to concurrent requests.
func TestServeBuiltin(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addr := make(chan string, 1)
	ended := make(chan error, 1)
	go func() {
		ended <- run(ctx, []string{"-addr", "127.0.0.1:0", "-device", "cpu", "-ctx", "256", "-sessions", "2"}, io.Discard, func(a string) { addr <- a })
	}()
	url := "http://" + <-addr
	results, _ := serveload.Run(3, func(i int) serveload.Result {
		return serveload.StreamChat(context.Background(), http.DefaultClient,
			serveload.Request{URL: url, Model: "manifold-builtin", IDs: []int{10 + i, 20, 30}, MaxTokens: 6})
	})
	for i, r := range results {
		if err := r.Complete(); err != nil || r.Tokens != 6 && r.Finish != "stop" {
			t.Errorf("request %d: %v, %d tokens, finish %q", i, err, r.Tokens, r.Finish)
		}
	}
	stop()
	if err := <-ended; err != nil {
		t.Error(err)
	}
}
