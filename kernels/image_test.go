package kernels

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestImageMatchesSources fails when manifold.cu, a *.cuh it includes or
// build.sh changed since manifold.fatbin was built: rebuild with build.sh on
// a machine with nvcc. The hash is build.sh's: sha256 of the sha256sum listing
// of manifold.cu, the *.cuh files in byte order, and build.sh.
func TestImageMatchesSources(t *testing.T) {
	headers, err := filepath.Glob("*.cuh")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(headers) // byte order, as build.sh's LC_ALL=C ls
	var listing strings.Builder
	for _, name := range append(append([]string{"manifold.cu"}, headers...), "build.sh") {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&listing, "%x  %s\n", sha256.Sum256(data), name)
	}
	sum := sha256.Sum256([]byte(listing.String()))
	want, err := os.ReadFile("manifold.fatbin.sum")
	if err != nil {
		t.Fatalf("no recorded hash: %v (run kernels/build.sh)", err)
	}
	if got := hex.EncodeToString(sum[:]); got != strings.TrimSpace(string(want)) {
		t.Fatalf("manifold.fatbin was built from other sources (recorded %s, sources now %s): run kernels/build.sh on a machine with nvcc and commit the image", strings.TrimSpace(string(want)), got)
	}
	if len(image) == 0 {
		t.Fatal("manifold.fatbin is empty")
	}
}
