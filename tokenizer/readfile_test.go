package tokenizer

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoadNotRegular: a named pipe named tokenizer.json is refused, naming
// it, instead of blocking the load.
func TestLoadNotRegular(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "tokenizer.json"), 0o644); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Load(dir); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "tokenizer.json is not a regular file") {
			t.Errorf("Load = %v, want an error naming tokenizer.json as not a regular file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Load blocked on a named pipe")
	}
}
