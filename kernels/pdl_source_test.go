package kernels

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestKernelsWaitForPredecessor reads the kernel sources: every kernel that
// the queue launches with programmatic serialization (pdlKernel) must call
// pdl_wait or pdl_entry, itself or in a function it calls, since it may
// start while the kernel before it still runs. No GPU needed.
func TestKernelsWaitForPredecessor(t *testing.T) {
	src := kernelSources(t)
	bodies := functionBodies(src)
	kernels := kernelNames(src)
	if len(kernels) < 50 {
		t.Fatalf("found only %d kernels in the sources: the parser is out of date", len(kernels))
	}
	for _, name := range kernels {
		if !pdlKernel(name) {
			continue
		}
		if !waits(name, bodies, map[string]bool{}) {
			t.Errorf("kernel %s is launched with programmatic serialization (pdlKernel) but never calls pdl_wait or pdl_entry", name)
		}
	}
	have := map[string]bool{}
	for _, k := range kernels {
		have[k] = true
	}
	for _, name := range plainKernels() {
		if !have[name] {
			t.Errorf("plainKernels names %s, which the sources do not define", name)
		}
	}
}

// kernelSources returns manifold.cu and the headers it includes, with the
// kernel-defining macros expanded for each kernel they define.
func kernelSources(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("*.cuh")
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, f := range append([]string{"manifold.cu"}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sb.Write(b)
		sb.WriteByte('\n')
	}
	return expandKernelMacros(comment.ReplaceAllString(sb.String(), ""))
}

var (
	macroDef   = regexp.MustCompile(`(?m)^#define (\w+)\(NAME[^)]*\)((?:.*\\\n)+.*)`)
	kernelDecl = regexp.MustCompile(`extern "C" __global__\s+void\s+(?:__\w+__\s*\([^)]*\)\s*)*(\w+)\s*\(`)
	funcDecl   = regexp.MustCompile(`\b(\w+)\s*(?:<[^<>;{}]*>)?\s*\((?:[^;{}()]|\([^;{}()]*\))*\)\s*(?:const\s*)?\{`)
	comment    = regexp.MustCompile(`//[^\n]*|(?s:/\*.*?\*/)`)
	callSite   = regexp.MustCompile(`\b(\w+)\s*(?:<[^<>;{}]*>)?\s*\(`)
)

// expandKernelMacros appends, for each macro whose first parameter is NAME
// and each of its uses M(name, ...), the macro's body with NAME replaced.
func expandKernelMacros(src string) string {
	var sb strings.Builder
	sb.WriteString(strings.ReplaceAll(src, "\\\n", "\n"))
	for _, m := range macroDef.FindAllStringSubmatch(src, -1) {
		body := strings.ReplaceAll(m[2], "\\\n", "\n")
		use := regexp.MustCompile(`(?m)^` + m[1] + `\((\w+)`)
		for _, u := range use.FindAllStringSubmatch(src, -1) {
			sb.WriteString("\n")
			sb.WriteString(regexp.MustCompile(`\bNAME\b`).ReplaceAllString(body, u[1]))
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

// kernelNames lists the extern "C" kernels (the macros' stand-in NAME left out).
func kernelNames(src string) []string {
	var names []string
	for _, m := range kernelDecl.FindAllStringSubmatch(src, -1) {
		if m[1] != "NAME" {
			names = append(names, m[1])
		}
	}
	return names
}

// controlWords look like functions to the patterns above.
var controlWords = map[string]bool{"if": true, "for": true, "while": true, "switch": true, "return": true, "sizeof": true}

// functionBodies maps each defined function (kernels and device functions)
// to the text of its bodies.
func functionBodies(src string) map[string]string {
	out := map[string]string{}
	for _, loc := range funcDecl.FindAllStringSubmatchIndex(src, -1) {
		name := src[loc[2]:loc[3]]
		if controlWords[name] {
			continue
		}
		open := loc[1] - 1
		depth, end := 0, len(src)
		for i := open; i < len(src); i++ {
			if src[i] == '{' {
				depth++
			} else if src[i] == '}' {
				if depth--; depth == 0 {
					end = i
					break
				}
			}
		}
		out[name] += src[open:end]
	}
	return out
}

// waits reports whether function name's body, or that of a function it
// calls, calls pdl_wait or pdl_entry.
func waits(name string, bodies map[string]string, seen map[string]bool) bool {
	if seen[name] {
		return false
	}
	seen[name] = true
	body := bodies[name]
	for _, m := range callSite.FindAllStringSubmatch(body, -1) {
		switch c := m[1]; c {
		case "pdl_wait", "pdl_entry":
			return true
		case name:
		default:
			if _, ok := bodies[c]; ok && waits(c, bodies, seen) {
				return true
			}
		}
	}
	return false
}
