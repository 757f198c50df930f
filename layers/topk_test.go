package layers

import (
	"bufio"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTopKMatchesLibstdcxx replays rows full of ties (NaN, ±inf, repeated
// values) through torch's CPU top-k algorithm compiled with libstdc++
// (testdata/gen_topk.cc) and requires the same indices in the same order.
func TestTopKMatchesLibstdcxx(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "topk_libstdcxx.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inf := float32(math.Inf(1))
	palette := []float32{float32(math.NaN()), -inf, -2, -1, 0, 0.25, 1, 3, inf}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var scratch TopKScratch
	cases := 0
	for sc.Scan() {
		head, tail, ok := strings.Cut(sc.Text(), " :")
		if !ok {
			t.Fatalf("bad line %q", sc.Text())
		}
		h := strings.Fields(head)
		n, _ := strconv.Atoi(h[0])
		k, _ := strconv.Atoi(h[1])
		sorted := h[2] == "1"
		row := make([]float32, n)
		for i, c := range h[3] {
			row[i] = palette[c-'0']
		}
		want := make([]int32, 0, k)
		for _, s := range strings.Fields(tail) {
			v, _ := strconv.Atoi(s)
			want = append(want, int32(v))
		}
		got := make([]int32, k)
		TopK(got, row, k, sorted, &scratch)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d k=%d sorted=%v row=%s: got %v, want %v", n, k, sorted, h[3], got, want)
		}
		cases++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < 1000 {
		t.Fatalf("only %d cases read", cases)
	}
}

// TestTopKDistinct checks both code paths against a full sort on rows
// without ties, where the answer is unique.
func TestTopKDistinct(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ n, k int }{
		{1, 1}, {5, 5}, {96, 16}, {96, 1}, {1024, 16}, {1024, 17}, {4096, 64}, {300, 299},
	} {
		row := make([]float32, tc.n)
		for i := range row {
			row[i] = rng.Float32()*2 - 1
		}
		order := make([]int32, tc.n)
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortFunc(order, func(a, b int32) int {
			if row[a] > row[b] {
				return -1
			}
			return 1
		})
		got := make([]int32, tc.k)
		TopK(got, row, tc.k, true, nil)
		if !slices.Equal(got, order[:tc.k]) {
			t.Errorf("n=%d k=%d sorted: got %v, want %v", tc.n, tc.k, got, order[:tc.k])
		}
		TopK(got, row, tc.k, false, nil)
		slices.Sort(got)
		want := slices.Clone(order[:tc.k])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("n=%d k=%d unsorted: got set %v, want %v", tc.n, tc.k, got, want)
		}
	}
}

func BenchmarkTopK(b *testing.B) {
	for _, tc := range []struct {
		name string
		n, k int
	}{{"n4096_k2048", 4096, 2048}, {"n65536_k2048", 65536, 2048}, {"n131072_k2048", 131072, 2048}} {
		b.Run(tc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 4))
			row := make([]float32, tc.n)
			for i := range row {
				row[i] = rng.Float32()
			}
			dst := make([]int32, tc.k)
			var s TopKScratch
			for b.Loop() {
				TopK(dst, row, tc.k, false, &s)
			}
		})
	}
}
