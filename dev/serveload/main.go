// Command serveload is the load test of cmd/serve: at each concurrency of
// -clients it runs that many clients, each sending -requests streamed greedy
// chat requests one after another, checks every stream complete (one event
// a token, [DONE], usage that agrees), and prints the output tokens/s, the
// p50/p99 time to first token and inter-token latency, and the server's
// mean batch (from /metrics).
//
//	go run ./dev/serveload -url http://127.0.0.1:8080 -model NAME -clients 1,8,32,64
//
// With -ids the requests are completions of token ids, for a model folder
// without a tokenizer (a testmodel checkpoint). It exits 1 when a request
// is incomplete.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/manifoldlm/manifold/internal/serveload"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "the server")
	model := flag.String("model", "", "the model's id (default: the server's first)")
	levels := flag.String("clients", "1,8,32", "concurrency levels, comma-separated")
	requests := flag.Int("requests", 4, "requests a client sends, one after another")
	maxTokens := flag.Int("max-tokens", 128, "max_tokens of each request")
	words := flag.Int("prompt-words", 32, "words of each prompt (each client's differ)")
	ids := flag.Bool("ids", false, "send completion requests of token ids (-prompt-words of them), for a model folder without a tokenizer")
	flag.Parse()
	if *model == "" {
		*model = firstModel(*url)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	failed := false
	for _, f := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			fmt.Fprintf(os.Stderr, "serveload: -clients %q: want positive integers\n", *levels)
			os.Exit(2)
		}
		steps0, seqs0 := scrape(*url)
		perClient, elapsed := serveload.Run(c, func(i int) []serveload.Result {
			var rs []serveload.Result
			for j := range *requests {
				prompt := fmt.Sprintf("Client %d request %d: %s", i, j, strings.Repeat("tell me more ", *words/3))
				r := serveload.Request{URL: *url, Model: *model, Prompt: prompt, MaxTokens: *maxTokens}
				if *ids {
					r.IDs = make([]int, *words)
					for k := range r.IDs {
						r.IDs[k] = 2 + (i*7919+j*104729+k*31)%200 // within any vocabulary of 256 or more
					}
				}
				rs = append(rs, serveload.StreamChat(context.Background(), client, r))
			}
			return rs
		})
		var results []serveload.Result
		for _, rs := range perClient {
			results = append(results, rs...)
		}
		steps1, seqs1 := scrape(*url)
		sum := serveload.Summarize(results)
		batch := 0.0
		if steps1 > steps0 {
			batch = (seqs1 - seqs0) / (steps1 - steps0)
		}
		fmt.Printf("clients %d: %.1f output tok/s, mean batch %.1f, %v\n", c, float64(sum.Tokens)/elapsed.Seconds(), batch, sum)
		for i, r := range results {
			if err := r.Complete(); err != nil {
				fmt.Fprintf(os.Stderr, "request %d: %v\n", i, err)
				failed = true
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

// firstModel is the id of the server's first model.
func firstModel(url string) string {
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		fmt.Fprintln(os.Stderr, "serveload:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	var list struct{ Data []struct{ ID string } }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		fmt.Fprintln(os.Stderr, "serveload: /v1/models lists no model", err)
		os.Exit(1)
	}
	return list.Data[0].ID
}

// scrape reads the batched steps and sequences counters from /metrics.
func scrape(url string) (steps, seqs float64) {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			continue
		}
		switch name {
		case "manifold_batch_steps_total":
			steps = f
		case "manifold_batch_sequences_total":
			seqs = f
		}
	}
	return steps, seqs
}
