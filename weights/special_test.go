//go:build unix

package weights

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// openTimeout opens path with Open, failing the test if it takes over a few
// seconds; the fifos, if any, are then opened for writing and closed, which
// lets a reader blocked on them go on.
func openTimeout(t *testing.T, path string, fifos ...string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		c, err := Open(path)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		for _, f := range fifos {
			if w, err := os.OpenFile(f, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close()
			}
		}
		<-done
		t.Fatalf("Open(%s) hung on a named pipe", path)
		return nil
	}
}

// TestOpenNotRegular gives Open a named pipe and a link to /dev/zero where it
// expects a checkpoint or an index: each is rejected at once with
// ErrNotRegular, naming the file.
func TestOpenNotRegular(t *testing.T) {
	mkfifo := func(t *testing.T, path string) {
		t.Helper()
		if err := syscall.Mkfifo(path, 0o644); err != nil {
			t.Skip("mkfifo:", err)
		}
	}
	check := func(t *testing.T, err error, file, what string) {
		t.Helper()
		if !errors.Is(err, ErrNotRegular) {
			t.Fatalf("error %v, want ErrNotRegular", err)
		}
		var e *Error
		if !errors.As(err, &e) || e.File != file {
			t.Fatalf("error %v does not name %s", err, file)
		}
		if !strings.Contains(err.Error(), what) {
			t.Errorf("error %q does not say %q", err, what)
		}
	}

	t.Run("fifo in folder", func(t *testing.T) {
		dir := t.TempDir()
		p := filepath.Join(dir, SingleFileName)
		mkfifo(t, p)
		check(t, openTimeout(t, dir, p), p, "named pipe")
		check(t, openTimeout(t, p, p), p, "named pipe")
	})
	t.Run("fifo index", func(t *testing.T) {
		dir := t.TempDir()
		writeShards(t, dir, map[string][]string{"a.safetensors": {"x"}}, "")
		p := filepath.Join(dir, IndexFileName)
		mkfifo(t, p)
		check(t, openTimeout(t, dir, p), p, "named pipe")
	})
	t.Run("fifo shard", func(t *testing.T) {
		dir := t.TempDir()
		writeShards(t, dir, map[string][]string{"a.safetensors": {"x"}}, `{"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}`)
		p := filepath.Join(dir, "b.safetensors")
		mkfifo(t, p)
		check(t, openTimeout(t, dir, p), p, "named pipe")
	})
	t.Run("link to /dev/zero", func(t *testing.T) {
		if _, err := os.Stat("/dev/zero"); err != nil {
			t.Skip(err)
		}
		dir := t.TempDir()
		p := filepath.Join(dir, SingleFileName)
		if err := os.Symlink("/dev/zero", p); err != nil {
			t.Fatal(err)
		}
		check(t, openTimeout(t, dir), p, "device")
		check(t, openTimeout(t, p), p, "/dev/zero")
	})
	t.Run("link to a regular file", func(t *testing.T) {
		dir := t.TempDir()
		writeShards(t, dir, map[string][]string{"a.safetensors": {"x"}}, "")
		p := filepath.Join(dir, SingleFileName)
		if err := os.Symlink("a.safetensors", p); err != nil {
			t.Fatal(err)
		}
		if err := openTimeout(t, dir); err != nil {
			t.Fatal("a link to a checkpoint:", err)
		}
	})
}
