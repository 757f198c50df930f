package golden

import (
	"path/filepath"
	"testing"
)

func TestPath(t *testing.T) {
	dir := Dir(t)
	for _, c := range []struct {
		elem []string
		want string
	}{
		{nil, dir},
		{[]string{"llama"}, filepath.Join(dir, "llama")},
		{[]string{"llama", "golden.safetensors"}, filepath.Join(dir, "llama", "golden.safetensors")},
	} {
		if got := Path(t, c.elem...); got != c.want {
			t.Errorf("Path(%q) = %s, want %s", c.elem, got, c.want)
		}
	}
}
