package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/manifoldlm/manifold/internal/testmodel"
)

// randomCheckpoint makes the folder holding spec's random checkpoint: keep,
// reused when it holds it already and written otherwise, or a new temporary
// folder, which cleanup removes. Progress goes to stderr.
func randomCheckpoint(ctx context.Context, spec testmodel.Spec, keep string, stderr io.Writer) (dir string, cleanup func(), err error) {
	cleanup = func() {}
	if keep != "" {
		if spec.Written(keep) {
			fmt.Fprintf(stderr, "bench: reusing the %s checkpoint in %s\n", spec.Name, keep)
			return keep, cleanup, nil
		}
		if err := clearCheckpoint(keep); err != nil {
			return "", cleanup, err
		}
		dir = keep
	} else {
		if dir, err = os.MkdirTemp("", "manifold-bench-"+spec.Name+"-"); err != nil {
			return "", cleanup, fmt.Errorf("-random: temporary folder: %w", err)
		}
		cleanup = func() { os.RemoveAll(dir) }
	}
	if err := writeRandom(ctx, spec, dir, stderr); err != nil {
		cleanup()
		if keep != "" && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("-keep %s: %w", keep, err)
		}
		return "", func() {}, err
	}
	return dir, cleanup, nil
}

// writeRandom writes spec into dir, reporting progress on stderr every few
// seconds; ctx's cancellation stops the write.
func writeRandom(ctx context.Context, spec testmodel.Spec, dir string, stderr io.Writer) error {
	total := spec.CheckpointBytes()
	fmt.Fprintf(stderr, "bench: writing a random %s checkpoint (%s) into %s\n", spec.Name, formatBytes(float64(total)), dir)
	start := time.Now()
	last := start
	err := spec.WriteProgress(dir, func(done, total int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if now := time.Now(); now.Sub(last) >= 2*time.Second {
			last = now
			fmt.Fprintf(stderr, "bench: %3.0f%% (%s of %s) in %.0fs\n", 100*float64(done)/float64(max(total, 1)),
				formatBytes(float64(done)), formatBytes(float64(total)), now.Sub(start).Seconds())
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench: wrote %s in %.1fs\n", spec.Name, time.Since(start).Seconds())
	return nil
}

// checkpointFile matches the files a random checkpoint is made of: its
// configs and stamp, its weights (single or sharded, with the index) and the
// writers' temporaries.
var checkpointFile = regexp.MustCompile(`^(config\.json|hf_quant_config\.json|` + regexp.QuoteMeta(testmodel.StampFile) +
	`|model\.safetensors|model\.safetensors\.index\.json|model-\d+-of-\d+\.safetensors|\..*\.tmp)$`)

// clearCheckpoint readies -keep's folder for a new random checkpoint: it
// creates it, or empties it of an earlier random checkpoint (whole or cut
// short: a stale shard or index would shadow the new weights). A folder
// holding anything else, or files without testmodel's stamp (a real
// model's), is refused, not cleared.
func clearCheckpoint(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-keep %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("-keep %s: %w", dir, err)
	}
	if len(entries) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, testmodel.StampFile)); err != nil {
		return fmt.Errorf("-keep %s: the folder is not empty and holds no random checkpoint (no %s): give an empty or new folder", dir, testmodel.StampFile)
	}
	for _, e := range entries {
		if e.IsDir() || !checkpointFile.MatchString(e.Name()) {
			return fmt.Errorf("-keep %s: the folder holds %s, which is not part of a random checkpoint: give an empty or new folder", dir, e.Name())
		}
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("-keep %s: %w", dir, err)
		}
	}
	return nil
}
