package defaultmodel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/backend/cpu"
	"github.com/manifoldlm/manifold/engine"
	"github.com/manifoldlm/manifold/internal/golden"
	"github.com/manifoldlm/manifold/layers"
	"github.com/manifoldlm/manifold/model"
	"github.com/manifoldlm/manifold/weights"
)

func TestExtract(t *testing.T) {
	root := t.TempDir()
	dir, err := ExtractTo(root)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ID()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(dir) != want {
		t.Errorf("extracted to %s, want a folder named %s", dir, want)
	}
	checkFiles(t, dir)
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("embedded model lacks %s: %v", name, err)
		}
	}

	// Reused as it is.
	fi, _ := os.Stat(filepath.Join(dir, "config.json"))
	dir2, err := ExtractTo(root)
	if err != nil || dir2 != dir {
		t.Fatalf("second extraction: %q, %v; want %q", dir2, err, dir)
	}
	if fi2, _ := os.Stat(filepath.Join(dir, "config.json")); !os.SameFile(fi, fi2) {
		t.Error("second extraction rewrote the folder")
	}

	// A damaged copy is replaced.
	if err := os.Remove(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if dir3, err := ExtractTo(root); err != nil || dir3 != dir {
		t.Fatalf("extraction over a damaged copy: %q, %v", dir3, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Error("damaged copy not repaired:", err)
	}

	// So is one whose file changed in place, size kept; a process that has
	// the damaged file open keeps reading it.
	name := filepath.Join(dir, "model.safetensors")
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if dir4, err := ExtractTo(root); err != nil || dir4 != dir {
		t.Fatalf("extraction over a changed copy: %q, %v", dir4, err)
	}
	checkFiles(t, dir)
	if got, err := io.ReadAll(old); err != nil || !bytes.Equal(got, b) {
		t.Errorf("the replaced file, open before: %d bytes, %v; want the %d it held", len(got), err, len(b))
	}

	// No temporary folders are left behind: the copy and the lock file only.
	left, _ := os.ReadDir(root)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != lockName(want) || names[1] != want {
		t.Errorf("cache root holds %v, want only %s and %s", names, lockName(want), want)
	}
}

func TestExtractErrors(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ExtractTo(filepath.Join(f, "sub")); err == nil || !strings.Contains(err.Error(), "defaultmodel") {
		t.Errorf("extracting below a file: error %v", err)
	}
}

// fixture is testdata/fixture.safetensors, written by training/train.py:
// input_ids_k and logits_k (PyTorch, float32 compute from the bf16
// weights), prompt_ids and greedy_ids.
type fixture struct {
	seqs           [][]int32
	logits         [][]float32
	prompt, greedy []int32
}

func loadFixture(t *testing.T) *fixture {
	t.Helper()
	ck, err := weights.Open(filepath.Join("testdata", "fixture.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ints := func(name string) []int32 { return golden.Int32s(t, ck, name) }
	fx := &fixture{prompt: ints("prompt_ids"), greedy: ints("greedy_ids")}
	for k := 0; ck.Has(fmt.Sprintf("input_ids_%d", k)); k++ {
		fx.seqs = append(fx.seqs, ints(fmt.Sprintf("input_ids_%d", k)))
		v, _ := golden.Float32s(t, ck, fmt.Sprintf("logits_%d", k))
		fx.logits = append(fx.logits, v)
	}
	if len(fx.seqs) == 0 {
		t.Fatal("fixture holds no sequences")
	}
	return fx
}

func loadModel(t *testing.T, dir string) model.Model {
	t.Helper()
	f, m, err := model.Open(dir, cpu.New(0), model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return m
}

func forwardAll(t *testing.T, m model.Model, ids []int32) []float32 {
	t.Helper()
	st, err := m.NewState(len(ids))
	if err != nil {
		t.Fatal(err)
	}
	out, err := m.Forward(context.Background(), st, ids, true)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLogitsMatchPyTorch runs the bf16 checkpoint the NVFP4 model was
// converted from and compares its logits with PyTorch's (tolerance 1e-3, as
// for the golden fixtures); it then decodes greedily through the cache from
// the fixture's prompt and reports agreement with PyTorch's greedy tokens.
func TestLogitsMatchPyTorch(t *testing.T) {
	fx := loadFixture(t)
	m := loadModel(t, filepath.Join("testdata", "bf16"))
	V := m.Config().VocabSize
	for k, ids := range fx.seqs {
		got := forwardAll(t, m, ids)
		if len(got) != len(fx.logits[k]) || len(got) != len(ids)*V {
			t.Fatalf("sequence %d: %d logits, fixture %d, want %d x %d", k, len(got), len(fx.logits[k]), len(ids), V)
		}
		var d float64
		for i := range got {
			d = max(d, math.Abs(float64(got[i])-float64(fx.logits[k][i])))
		}
		if d > 1e-3 {
			t.Errorf("sequence %d (%d tokens): max |logit - PyTorch| %.3g > 1e-3", k, len(ids), d)
		} else {
			t.Logf("sequence %d (%d tokens): max |logit - PyTorch| %.3g", k, len(ids), d)
		}
	}

	st, err := m.NewState(len(fx.prompt) + len(fx.greedy))
	if err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward(context.Background(), st, fx.prompt, false)
	if err != nil {
		t.Fatal(err)
	}
	match := 0
	for i, want := range fx.greedy {
		next := int32(layers.Argmax(logits))
		if next != want {
			break
		}
		match = i + 1
		if logits, err = m.Forward(context.Background(), st, []int32{next}, false); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("greedy through the cache: %d of %d tokens equal PyTorch's", match, len(fx.greedy))
	if match == 0 {
		t.Error("the first greedy token differs from PyTorch's")
	}
}

// TestNVFP4CloseToBF16 compares the embedded NVFP4 model with the bf16
// checkpoint on the fixture's sequences: mean KL divergence per position
// and top-1 agreement.
func TestNVFP4CloseToBF16(t *testing.T) {
	fx := loadFixture(t)
	dir, err := ExtractTo(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	q := loadModel(t, dir)
	V := q.Config().VocabSize
	var kl float64
	var n, agree int
	for k, ids := range fx.seqs {
		got := forwardAll(t, q, ids)
		for p := range ids {
			ref, our := fx.logits[k][p*V:(p+1)*V], got[p*V:(p+1)*V]
			kl += klDiv(ref, our)
			if layers.Argmax(ref) == layers.Argmax(our) {
				agree++
			}
			n++
		}
	}
	kl /= float64(n)
	t.Logf("NVFP4 vs bf16 over %d positions: mean KL %.4f nats, top-1 agreement %.1f%%", n, kl, 100*float64(agree)/float64(n))
	if kl > 0.1 {
		t.Errorf("mean KL %.4f nats > 0.1", kl)
	}
}

func klDiv(zp, zq []float32) float64 {
	lp, lq := layers.LogSumExp(zp), layers.LogSumExp(zq)
	var kl float64
	for i := range zp {
		a, b := float64(zp[i])-lp, float64(zq[i])-lq
		kl += math.Exp(a) * (a - b)
	}
	return kl
}

// signatures are the prompts of TestFunctionBodiesParse: one per line, each
// followed by " {\n" and completed by the model.
var signatures = []string{
	"func main()",
	"func Max(a, b int) int",
	"func reverse(s []byte)",
	"func (b *Buffer) Len() int",
	"func isSpace(c byte) bool",
	"func Contains(s, substr string) bool",
	"func (m *Map) Get(key string) (value any, ok bool)",
	"func sum(xs []float64) float64",
	"func ReadFile(name string) ([]byte, error)",
	"func (e *Error) Error() string",
	"func parseInt(s string) (int, error)",
	"func (s *Stack) Push(v int)",
	"func abs(x int) int",
	"func TestReverse(t *testing.T)",
	"func (c *Client) Close() error",
	"func hash(key []byte) uint32",
	"func NewReader(r io.Reader) *Reader",
	"func (l *List) Remove(e *Element) any",
	"func isDigit(r rune) bool",
	"func (t *Tree) Insert(key int)",
}

// functionSource returns the file that a signature and the model's
// continuation make: the continuation up to the first line that is "}"
// (gofmt's end of a top-level function); ok is false when there is none.
func functionSource(sig, cont string) (src string, ok bool) {
	body := "\n" + cont
	i := strings.Index(body, "\n}")
	if i < 0 {
		return "", false
	}
	return "package p\n\n" + sig + " {" + body[:i+2] + "\n", true
}

// TestFunctionBodiesParse samples a continuation of each signature from the
// embedded model and reports the share that go/parser accepts as a
// function (syntax only: undefined names are not checked).
func TestFunctionBodiesParse(t *testing.T) {
	dir, err := ExtractTo(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Load(dir, engine.Options{Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	parsed := 0
	for i, sig := range signatures {
		s, err := m.NewSession(512)
		if err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		_, err = s.GenerateText(context.Background(), sig+" {\n", engine.GenerateOptions{
			MaxTokens: 160,
			Sampling:  engine.SamplingOptions{Temperature: 0.5, TopK: 40, Seed: uint64(i + 1)},
		}, func(tk engine.Token) error {
			sb.WriteString(tk.Text)
			if strings.Contains("\n"+sb.String(), "\n}") {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			t.Fatal(err)
		}
		src, ok := functionSource(sig, sb.String())
		if ok {
			_, perr := parser.ParseFile(token.NewFileSet(), "gen.go", src, parser.SkipObjectResolution)
			ok = perr == nil
		}
		if ok {
			parsed++
		}
		if testing.Verbose() {
			t.Logf("%v %s {\n%s", ok, sig, sb.String())
		}
	}
	share := float64(parsed) / float64(len(signatures))
	t.Logf("%d of %d continuations (%.0f%%) parse as a function", parsed, len(signatures), 100*share)
	if share < 0.25 {
		t.Errorf("only %.0f%% of the continuations parse; want at least 25%%", 100*share)
	}
}

// errStop ends generation at the function's closing brace.
var errStop = errors.New("end of function")

// BenchmarkExtractWarm is the cost of finding an already extracted model:
// hashing the embedded files and checking the folder.
func BenchmarkExtractWarm(b *testing.B) {
	root := b.TempDir()
	if _, err := ExtractTo(root); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := ExtractTo(root); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtractCold writes the model into a fresh folder each time.
func BenchmarkExtractCold(b *testing.B) {
	root := b.TempDir()
	for i := 0; b.Loop(); i++ {
		if _, err := ExtractTo(filepath.Join(root, fmt.Sprint(i))); err != nil {
			b.Fatal(err)
		}
	}
}
