//go:build unix

package weights

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOpenCopy: with OpenOptions.Copy a checkpoint, single or sharded,
// reads as a mapped one does, and a file truncated and rewritten in place
// after the open changes nothing that was read into memory.
func TestOpenCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.safetensors")
	writeFile(t, path, sampleTensors())
	c, err := OpenWith(path, OpenOptions{Copy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not a checkpoint"), 0o644); err != nil {
		t.Fatal(err)
	}
	checkTensors(t, c, sampleTensors())

	dir := t.TempDir()
	writeShards(t, dir, map[string][]string{"a.safetensors": {"x", "w"}, "b.safetensors": {"y"}},
		`{"weight_map":{"x":"a.safetensors","y":"b.safetensors","w":"a.safetensors"}}`)
	s, err := OpenWith(dir, OpenOptions{Copy: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Truncate(filepath.Join(dir, "b.safetensors"), 0)
	if y, err := s.Tensor("y"); err != nil || !slices.Equal(y.Data, []byte{7}) {
		t.Errorf("Tensor(y) of a copied shard = %+v, %v", y, err)
	}

	// A file shorter than measured at the open: ErrTruncated.
	f, err := os.Open(filepath.Join(dir, "a.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	if _, err := readFile(f.Name(), f, st.Size()+10); !errors.Is(err, ErrTruncated) {
		t.Errorf("reading past the end: %v, want ErrTruncated", err)
	}
}

// TestTruncatedWhileOpen truncates a checkpoint's file after the open and
// then reads its tensors, in a child process: mapped (the default), the
// process dies of SIGBUS, the documented behaviour; copied, it reads the
// data as it was.
func TestTruncatedWhileOpen(t *testing.T) {
	if path := os.Getenv("MANIFOLD_WEIGHTS_TRUNCATE"); path != "" {
		c, err := OpenWith(path, OpenOptions{Copy: os.Getenv("MANIFOLD_WEIGHTS_COPY") != ""})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
		checkTensors(t, c, sampleTensors())
		return
	}
	for _, copied := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "x.safetensors")
		writeFile(t, path, sampleTensors())
		cmd := exec.Command(os.Args[0], "-test.run=^TestTruncatedWhileOpen$", "-test.count=1")
		cmd.Env = append(os.Environ(), "MANIFOLD_WEIGHTS_TRUNCATE="+path)
		if copied {
			cmd.Env = append(cmd.Env, "MANIFOLD_WEIGHTS_COPY=1")
		}
		out, err := cmd.CombinedOutput()
		switch {
		case copied && err != nil:
			t.Errorf("copied checkpoint, file truncated: %v\n%s", err, out)
		case !copied && (err == nil || !strings.Contains(string(out), "SIGBUS")):
			t.Errorf("mapped checkpoint, file truncated: %v, want a death by SIGBUS\n%s", err, out)
		}
	}
}
