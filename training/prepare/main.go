// Command prepare collects the training data of the default model: the Go
// standard library's own .go sources (BSD-licensed, by the Go Authors), split
// by package into a training set and a held-out validation set.
//
//	go run ./training/prepare [-goroot DIR] [-out .train] [-seed 1] [-val-frac 0.04]
//
// It walks GOROOT/src, skipping testdata and vendor folders, generated files
// ("Code generated ... DO NOT EDIT."), files that do not parse as Go, files
// larger than -max-file-bytes and files that are not UTF-8. _test.go files
// are kept. Held-out packages are drawn with a seeded shuffle from the
// library packages (import paths outside cmd/, without an internal/ element
// or one starting with "_", at most -max-val-pkg-bytes each) until they hold -val-frac of the
// bytes; every file of a held-out package goes to validation, every other
// file to training.
//
// It writes into -out: train.txt and val.txt (each file's text preceded by
// the separator <|endoftext|>, which the tokenizer turns into its
// end-of-text token), their gzip-compressed copies train.txt.gz and
// val.txt.gz (what travels to the training machine), val_packages.txt (the
// held-out import paths) and manifest.json (counts, bytes, the Go version and
// the flags). The output depends only on the flags and the GOROOT's sources.
//
// The command owns the data set only; training is training/train.py.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// Separator precedes every file in train.txt and val.txt; it is the
// tokenizer's end-of-text special token.
const Separator = "<|endoftext|>"

type options struct {
	goroot          string
	out             string
	seed            uint64
	valFrac         float64
	maxFileBytes    int
	maxValPkgBytes  int
	includeTests    bool
	includeCommands bool
}

type file struct {
	rel  string // path below GOROOT/src, slash-separated
	pkg  string // its folder: the import path
	text []byte
}

type manifest struct {
	GoVersion      string   `json:"go_version"`
	Seed           uint64   `json:"seed"`
	ValFrac        float64  `json:"val_frac"`
	MaxFileBytes   int      `json:"max_file_bytes"`
	MaxValPkgBytes int      `json:"max_val_pkg_bytes"`
	IncludeTests   bool     `json:"include_tests"`
	IncludeCmd     bool     `json:"include_cmd"`
	Skipped        skipped  `json:"skipped"`
	TrainFiles     int      `json:"train_files"`
	TrainBytes     int      `json:"train_bytes"`
	ValFiles       int      `json:"val_files"`
	ValBytes       int      `json:"val_bytes"`
	ValPackages    []string `json:"val_packages"`
}

type skipped struct {
	Generated int `json:"generated"`
	TooLarge  int `json:"too_large"`
	NoParse   int `json:"no_parse"`
	NotUTF8   int `json:"not_utf8"`
	Separator int `json:"contains_separator"`
	Tests     int `json:"tests"`
	Commands  int `json:"commands"`
}

func main() {
	o := options{}
	flag.StringVar(&o.goroot, "goroot", "", "Go root whose src/ is read (default: `go env GOROOT`)")
	flag.StringVar(&o.out, "out", ".train", "output folder")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the held-out package draw")
	flag.Float64Var(&o.valFrac, "val-frac", 0.04, "share of the bytes held out for validation")
	flag.IntVar(&o.maxFileBytes, "max-file-bytes", 200_000, "skip larger files")
	flag.IntVar(&o.maxValPkgBytes, "max-val-pkg-bytes", 400_000, "never hold out a package larger than this")
	flag.BoolVar(&o.includeTests, "tests", true, "keep _test.go files")
	flag.BoolVar(&o.includeCommands, "cmd", true, "keep the sources under src/cmd (training only; never held out)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "prepare:", err)
		os.Exit(1)
	}
}

func goroot(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w (pass -goroot)", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func run(o options) error {
	root, err := goroot(o.goroot)
	if err != nil {
		return err
	}
	src := filepath.Join(root, "src")
	var sk skipped
	files, err := collect(src, o, &sk)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no .go files found under %s", src)
	}
	val := heldOut(files, o)
	m := manifest{
		GoVersion: goVersion(root), Seed: o.seed, ValFrac: o.valFrac, MaxFileBytes: o.maxFileBytes,
		MaxValPkgBytes: o.maxValPkgBytes, IncludeTests: o.includeTests, IncludeCmd: o.includeCommands,
		Skipped: sk,
	}
	var train, valBuf bytes.Buffer
	for _, f := range files {
		if val[f.pkg] {
			valBuf.WriteString(Separator)
			valBuf.Write(f.text)
			m.ValFiles++
			m.ValBytes += len(f.text)
		} else {
			train.WriteString(Separator)
			train.Write(f.text)
			m.TrainFiles++
			m.TrainBytes += len(f.text)
		}
	}
	for p := range val {
		m.ValPackages = append(m.ValPackages, p)
	}
	sort.Strings(m.ValPackages)

	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"train.txt": train.Bytes(), "val.txt": valBuf.Bytes()} {
		if err := writeBoth(filepath.Join(o.out, name), b); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(o.out, "val_packages.txt"), []byte(strings.Join(m.ValPackages, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "manifest.json"), append(mj, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s: train %d files %.1f MB, val %d files %.2f MB in %d packages; skipped %+v\n",
		m.GoVersion, m.TrainFiles, float64(m.TrainBytes)/1e6, m.ValFiles, float64(m.ValBytes)/1e6, len(m.ValPackages), sk)
	return nil
}

// collect reads every kept .go file below src, sorted by path.
func collect(src string, o options, sk *skipped) ([]file, error) {
	var files []file
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if name == "testdata" || name == "vendor" || (strings.HasPrefix(name, ".") && path != src) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !o.includeTests && strings.HasSuffix(name, "_test.go") {
			sk.Tests++
			return nil
		}
		if !o.includeCommands && strings.HasPrefix(rel, "cmd/") {
			sk.Commands++
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		switch {
		case len(text) > o.maxFileBytes:
			sk.TooLarge++
			return nil
		case !utf8.Valid(text):
			sk.NotUTF8++
			return nil
		case bytes.Contains(text, []byte(Separator)):
			sk.Separator++
			return nil
		}
		af, err := parser.ParseFile(token.NewFileSet(), path, text, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			sk.NoParse++
			return nil
		}
		if ast.IsGenerated(af) {
			sk.Generated++
			return nil
		}
		files = append(files, file{rel: rel, pkg: pathDir(rel), text: text})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", src, err)
	}
	slices.SortFunc(files, func(a, b file) int { return strings.Compare(a.rel, b.rel) })
	return files, nil
}

func pathDir(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return "."
}

// heldOut draws the validation packages: library packages (not under cmd/,
// no internal/ or _-prefixed element, not too large) in a seeded shuffle of their sorted
// list, until they hold valFrac of all bytes.
func heldOut(files []file, o options) map[string]bool {
	size := map[string]int{}
	total := 0
	for _, f := range files {
		size[f.pkg] += len(f.text)
		total += len(f.text)
	}
	var cands []string
	for p, n := range size {
		if strings.HasPrefix(p, "cmd/") || p == "cmd" || n > o.maxValPkgBytes || p == "." || p == "builtin" || p == "unsafe" ||
			slices.ContainsFunc(strings.Split(p, "/"), func(e string) bool { return e == "internal" || strings.HasPrefix(e, "_") }) {
			continue
		}
		cands = append(cands, p)
	}
	sort.Strings(cands)
	r := rand.New(rand.NewPCG(o.seed, 0x6d616e69666f6c64)) // "manifold"
	r.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	val := map[string]bool{}
	target := int(o.valFrac * float64(total))
	got := 0
	for _, p := range cands {
		if got >= target {
			break
		}
		val[p] = true
		got += size[p]
	}
	return val
}

func goVersion(root string) string {
	b, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		return runtime.Version()
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}

// writeBoth writes b to path and gzip-compressed to path+".gz".
func writeBoth(path string, b []byte) error {
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return err
	}
	var z bytes.Buffer
	w, err := gzip.NewWriterLevel(&z, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return errors.Join(fmt.Errorf("gzip %s", path), err)
	}
	return os.WriteFile(path+".gz", z.Bytes(), 0o644)
}
