// Package testproc starts the child processes that tests run (usually the
// test binary itself again, to run one test in a fresh process). Only tests
// import it.
package testproc

import (
	"bytes"
	"io"
	"os/exec"
	"testing"
)

// Start starts cmd with its standard output piped (read it from stdout) and
// its standard error gathered in stderr, failing t on an error. A process
// the test has not waited for is killed and waited for when the test ends.
func Start(t testing.TB, cmd *exec.Cmd) (stdout io.ReadCloser, stderr *bytes.Buffer) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr = new(bytes.Buffer)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return stdout, stderr
}
