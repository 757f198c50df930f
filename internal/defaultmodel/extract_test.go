package defaultmodel

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/manifoldlm/manifold/internal/testproc"
	"github.com/manifoldlm/manifold/weights"
)

// childEnv marks a re-executed test binary as a child of one of the tests
// below; its value says what the child does.
const childEnv = "MANIFOLD_DEFAULTMODEL_CHILD"

// child starts this test binary as a child process running
// TestExtractChild with mode and root in its environment.
func child(t *testing.T, mode, root string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExtractChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "MANIFOLD_DEFAULTMODEL_ROOT="+root)
	return cmd
}

// TestExtractChild is the body of the child processes; it is skipped
// unless childEnv is set.
//
//	extract: wait for root/go to appear (so that every child starts at
//	         once), extract, and check what a run of cmd/generate reads:
//	         every file equal to the embedded one, the checkpoint opens.
//	hang:    extract, but stop for good after writing the temporary
//	         folder (holding the lock), having printed "paused".
func TestExtractChild(t *testing.T) {
	mode, root := os.Getenv(childEnv), os.Getenv("MANIFOLD_DEFAULTMODEL_ROOT")
	switch mode {
	case "":
		t.Skip("run as a child process by TestExtractProcesses and TestExtractKilled")
	case "extract":
		for {
			if _, err := os.Stat(filepath.Join(root, "..", "go")); err == nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		dir, err := ExtractTo(root)
		if err != nil {
			t.Fatal(err)
		}
		checkFiles(t, dir)
		ck, err := weights.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		ck.Close()
	case "hang":
		_, err := extract(root, extractOptions{lockWait: time.Minute, beforePublish: func(tmp string) {
			fmt.Println("paused", tmp)
			time.Sleep(time.Hour) // until killed
		}})
		t.Fatal("extract returned:", err)
	default:
		t.Fatalf("unknown %s %q", childEnv, mode)
	}
}

// checkFiles checks that dir holds every embedded file, byte for byte.
func checkFiles(t *testing.T, dir string) {
	t.Helper()
	es, err := entries()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		got, err := os.ReadFile(filepath.Join(dir, e.name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, e.data) {
			t.Fatalf("%s differs from the embedded file", e.name)
		}
	}
}

// TestExtractProcesses starts several processes at once, each extracting
// the model into the same empty cache folder and then reading it, as
// concurrent first runs of cmd/generate do; every one must succeed, in
// every round.
func TestExtractProcesses(t *testing.T) {
	const procs, rounds = 6, 5
	failed := 0
	for r := range rounds {
		base := t.TempDir()
		root := filepath.Join(base, "cache")
		cmds := make([]*exec.Cmd, procs)
		outs := make([]bytes.Buffer, procs)
		for i := range cmds {
			cmds[i] = child(t, "extract", root)
			cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
			if err := cmds[i].Start(); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond) // let them all reach the barrier
		if err := os.WriteFile(filepath.Join(base, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for i, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				failed++
				t.Errorf("round %d, process %d: %v\n%s", r, i, err, outs[i].String())
			}
		}
		checkFiles(t, filepath.Join(root, mustID(t)))
	}
	if failed > 0 {
		t.Errorf("%d of %d extractions failed", failed, procs*rounds)
	}
}

func mustID(t *testing.T) string {
	t.Helper()
	id, err := ID()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestExtractKilled stops a process in the middle of an extraction, holding
// the lock with its temporary folder written: another extraction waits for
// the lock and gives up with an error naming it; once the process is
// killed, an extraction succeeds and removes the dead process's folder.
func TestExtractKilled(t *testing.T) {
	root := filepath.Join(t.TempDir(), "cache")
	cmd := child(t, "hang", root)
	stdout, stderr := testproc.Start(t, cmd)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	tmp, ok := strings.CutPrefix(strings.TrimSpace(line), "paused ")
	if !ok {
		t.Fatalf("child printed %q", line)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatal("the paused child's temporary folder:", err)
	}

	// A live holder: wait, then fail naming the lock.
	_, err = extract(root, extractOptions{lockWait: 200 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), lockName(mustID(t))) {
		t.Fatalf("extraction beside a live extraction: error %v, want one naming the lock", err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatal("a live extraction's temporary folder was touched:", err)
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	dir, err := ExtractTo(root)
	if err != nil {
		t.Fatal("extraction after a killed one:", err)
	}
	checkFiles(t, dir)
	if _, err := os.Stat(tmp); err == nil {
		t.Error("the killed extraction's temporary folder is still there")
	}

	// A leftover beside a complete copy is removed by the next run too.
	left := filepath.Join(root, tempPrefix(mustID(t))+"leftover")
	if err := os.Mkdir(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "model.safetensors"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	if dir2, err := ExtractTo(root); err != nil || dir2 != dir {
		t.Fatalf("extraction beside a leftover: %q, %v", dir2, err)
	}
	if _, err := os.Stat(left); err == nil {
		t.Error("a leftover temporary folder beside a complete copy was not removed")
	}
	checkFiles(t, dir)
}
