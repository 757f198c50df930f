// Command cpuprof writes a CPU profile of Manifold's CPU decode or prefill
// on a model folder (issue 61: where the time goes beside llama.cpp):
//
//	go run ./dev/peer/cpuprof -model /work/peer/models/llama-1b-32k -o decode.pprof
//	go tool pprof -top decode.pprof
//
// decode: -n tokens generated after a -p token prompt (the profile covers
// the decode steps only); prefill (-prefill): one -p token prompt.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime/pprof"

	"github.com/manifoldlm/manifold/engine"
)

func main() {
	var o struct {
		dir, out      string
		p, n, threads int
		prefill       bool
	}
	flag.StringVar(&o.dir, "model", "", "model folder")
	flag.StringVar(&o.out, "o", "cpu.pprof", "profile file")
	flag.IntVar(&o.p, "p", 512, "prompt tokens")
	flag.IntVar(&o.n, "n", 64, "decode tokens")
	flag.IntVar(&o.threads, "threads", 0, "CPU threads (0: all cores)")
	flag.BoolVar(&o.prefill, "prefill", false, "profile the prompt instead of the decode")
	flag.Parse()
	dir, out, p, n, threads, prefill := &o.dir, &o.out, &o.p, &o.n, &o.threads, &o.prefill
	m, err := engine.Load(*dir, engine.Options{Device: "cpu", Threads: *threads, ContextLength: *p + *n + 8})
	if err != nil {
		log.Fatal(err)
	}
	s, err := m.NewSession(*p + *n + 8)
	if err != nil {
		log.Fatal(err)
	}
	prompt := make([]int, *p)
	for i := range prompt {
		prompt[i] = 1 + i%100
	}
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if *prefill {
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
	}
	if _, err := s.Append(ctx, prompt); err != nil {
		log.Fatal(err)
	}
	if !*prefill {
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		res, err := s.Generate(ctx, nil, engine.GenerateOptions{MaxTokens: *n, StopTokens: []int{}}, nil)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("decode: %d tokens, %.1f tok/s\n", len(res.Tokens), float64(len(res.Tokens))/res.DecodeDuration.Seconds())
	}
	pprof.StopCPUProfile()
	if err := f.Close(); err != nil {
		log.Fatal(err)
	}
}
