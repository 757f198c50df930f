package weights

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/manifoldlm/manifold/quant"
)

// rawFile assembles a safetensors file from a header string and dataLen
// bytes of data (byte i holds i).
func rawFile(hdr string, dataLen int) []byte {
	b := make([]byte, 8, 8+len(hdr)+dataLen)
	binary.LittleEndian.PutUint64(b, uint64(len(hdr)))
	b = append(b, hdr...)
	for i := range dataLen {
		b = append(b, byte(i))
	}
	return b
}

func writeTemp(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func lenPrefix(n uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, n)
	return b
}

func TestParseBadFiles(t *testing.T) {
	tests := []struct {
		name   string
		file   []byte
		want   []error
		tensor string // the tensor the error must name, if any
	}{
		{"empty file", nil, []error{ErrTruncated}, ""},
		{"shorter than length prefix", []byte{1, 2, 3}, []error{ErrTruncated}, ""},
		{"header length past end", append(lenPrefix(100), "{}"...), []error{ErrHeaderLength, ErrTruncated}, ""},
		{"absurd header length", append(lenPrefix(1<<62), "{}"...), []error{ErrHeaderLength}, ""},
		{"header just over limit", append(lenPrefix(MaxHeaderSize+1), "{}"...), []error{ErrHeaderLength}, ""},
		{"header not JSON", rawFile("xyz", 0), []error{ErrBadHeader}, ""},
		{"header empty", rawFile("", 0), []error{ErrBadHeader}, ""},
		{"header is array", rawFile("[]", 0), []error{ErrBadHeader}, ""},
		{"header is string", rawFile(`"a"`, 0), []error{ErrBadHeader}, ""},
		{"header truncated JSON", rawFile(`{"a":{"dtype":"F32"`, 0), []error{ErrBadHeader}, ""},
		{"trailing data", rawFile(`{} {}`, 0), []error{ErrBadHeader}, ""},
		{"entry not object", rawFile(`{"a":3}`, 0), []error{ErrBadHeader}, "a"},
		{"entry lacks shape", rawFile(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, 4), []error{ErrBadHeader}, "a"},
		{"entry lacks offsets", rawFile(`{"a":{"dtype":"F32","shape":[1]}}`, 4), []error{ErrBadHeader}, "a"},
		{"unknown dtype", rawFile(`{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}}`, 4), []error{ErrUnknownDType}, "a"},
		{"negative dim", rawFile(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), []error{ErrBadHeader}, "a"},
		{"fractional dim", rawFile(`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, 4), []error{ErrBadHeader}, "a"},
		{"three offsets", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8), []error{ErrBadHeader}, "a"},
		{"huge offset", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1e30]}}`, 8), []error{ErrBadHeader}, "a"},
		{"inverted offsets", rawFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4), []error{ErrOutOfRange}, "a"},
		{"negative offset", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}}`, 4), []error{ErrOutOfRange}, "a"},
		{"offsets past end", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), []error{ErrOutOfRange, ErrTruncated}, "a"},
		{"size mismatch", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4), []error{ErrSizeMismatch}, "a"},
		{"dtype size mismatch", rawFile(`{"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,4]}}`, 4), []error{ErrSizeMismatch}, "a"},
		{"shape overflows", rawFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}}`, 4), []error{ErrSizeMismatch}, "a"},
		{"overlap", rawFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12), []error{ErrOverlap}, "b"},
		{"same range twice", rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 4), []error{ErrOverlap}, ""},
		{"duplicate name", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2), []error{ErrDuplicate}, "a"},
		{"metadata not strings", rawFile(`{"__metadata__":{"a":1}}`, 0), []error{ErrBadHeader}, ""},
		{"metadata not object", rawFile(`{"__metadata__":[]}`, 0), []error{ErrBadHeader}, ""},
	}
	dir := t.TempDir()
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(how string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", how)
				}
				for _, w := range tt.want {
					if !errors.Is(err, w) {
						t.Errorf("%s: error %q is not %v", how, err, w)
					}
				}
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("%s: error %q is not an *Error", how, err)
				}
				if tt.tensor != "" && e.Tensor != tt.tensor {
					t.Errorf("%s: error names tensor %q, want %q", how, e.Tensor, tt.tensor)
				}
			}
			_, err := parseFile("mem.safetensors", tt.file)
			check("parseFile", err)
			p := writeTemp(t, dir, fmt.Sprintf("bad%d.safetensors", i), tt.file)
			c, err := Open(p)
			if c != nil {
				c.Close()
				t.Fatal("Open returned a checkpoint with an error")
			}
			check("Open", err)
			if !strings.Contains(err.Error(), p) {
				t.Errorf("Open error %q does not name the file %s", err, p)
			}
		})
	}
}

func TestParseGoodEdgeCases(t *testing.T) {
	tests := []struct {
		name string
		file []byte
		n    int
	}{
		{"empty header", rawFile("{}", 0), 0},
		{"padded header", rawFile(`{}      `, 0), 0},
		{"scalar", rawFile(`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, 4), 1},
		{"zero-size tensors share an offset", rawFile(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}}`, 0), 2},
		{"gap between tensors", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}}`, 4), 2},
		{"out of order offsets", rawFile(`{"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 4), 2},
		{"zero dim after huge dims", rawFile(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}`, 0), 1},
		{"unknown entry fields ignored", rawFile(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1), 1},
	}
	for _, tt := range tests {
		h, err := parseFile(tt.name, tt.file)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if len(h.tensors) != tt.n {
			t.Errorf("%s: %d tensors, want %d", tt.name, len(h.tensors), tt.n)
		}
	}
}

// testTensor is a tensor to write in tests.
type testTensor struct {
	name  string
	dtype DType
	shape []int
	vals  []float32 // for float dtypes
	ints  []int64   // for integer dtypes
}

func (tt testTensor) bytes() []byte {
	n := 1
	for _, d := range tt.shape {
		n *= d
	}
	b := make([]byte, n*tt.dtype.Size())
	switch tt.dtype {
	case F32:
		for i, v := range tt.vals {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case BF16:
		quant.EncodeBF16(b, tt.vals)
	case F16:
		quant.EncodeF16(b, tt.vals)
	case F8E4M3:
		quant.EncodeE4M3(b, tt.vals)
	case I64:
		for i, v := range tt.ints {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
		}
	case I32:
		for i, v := range tt.ints {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
	case I8, U8:
		for i, v := range tt.ints {
			b[i] = byte(v)
		}
	}
	return b
}

// tensorWriter is a Writer or a ShardedWriter.
type tensorWriter interface {
	Add(name string, dtype DType, shape []int, data []byte) error
	Close() error
}

// writeAll adds ts to w and closes it, failing t on an error.
func writeAll(t testing.TB, w tensorWriter, ts []testTensor) {
	t.Helper()
	for _, tt := range ts {
		if err := w.Add(tt.name, tt.dtype, tt.shape, tt.bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeFile writes ts to a new file at path.
func writeFile(t testing.TB, path string, ts []testTensor) {
	t.Helper()
	w, err := Create(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	writeAll(t, w, ts)
}

func sampleTensors() []testTensor {
	return []testTensor{
		{"f32", F32, []int{2, 3}, []float32{1, -2, 3.5, 0, 1e-30, -7}, nil},
		{"bf16", BF16, []int{4}, []float32{1, -2, 0.5, 256}, nil},
		{"f16", F16, []int{2, 2}, []float32{1, -2, 0.5, 65504}, nil},
		{"fp8", F8E4M3, []int{3}, []float32{1, -448, 0.015625}, nil},
		{"i64", I64, []int{3}, nil, []int64{1, -1, math.MaxInt64}},
		{"i32", I32, []int{2}, nil, []int64{-5, math.MaxInt32}},
		{"i8", I8, []int{2}, nil, []int64{-128, 127}},
		{"u8", U8, []int{2}, nil, []int64{0, 255}},
		{"scalar", F32, []int{}, []float32{42}, nil},
		{"empty", F32, []int{0, 5}, []float32{}, nil},
	}
}

func checkTensors(t *testing.T, c *Checkpoint, want []testTensor) {
	t.Helper()
	var names []string
	for _, tt := range want {
		names = append(names, tt.name)
		got, err := c.Tensor(tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if got.DType != tt.dtype || !slices.Equal(got.Shape, tt.shape) {
			t.Errorf("%s: %s %v, want %s %v", tt.name, got.DType, got.Shape, tt.dtype, tt.shape)
		}
		if tt.ints != nil {
			v, err := got.Int64s()
			if err != nil || !slices.Equal(v, tt.ints) {
				t.Errorf("%s: Int64s = %v, %v; want %v", tt.name, v, err, tt.ints)
			}
			if _, err := got.Float32(); !errors.Is(err, ErrDType) {
				t.Errorf("%s: Float32 of %s: err %v, want ErrDType", tt.name, tt.dtype, err)
			}
			continue
		}
		v, err := got.Float32()
		if err != nil || !slices.Equal(v, tt.vals) {
			t.Errorf("%s: Float32 = %v, %v; want %v", tt.name, v, err, tt.vals)
		}
		if _, err := got.Int64s(); !errors.Is(err, ErrDType) {
			t.Errorf("%s: Int64s of %s: err %v, want ErrDType", tt.name, tt.dtype, err)
		}
	}
	slices.Sort(names)
	if !slices.Equal(c.Names(), names) {
		t.Errorf("Names() = %v, want %v", c.Names(), names)
	}
}

func TestWriterRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	md := map[string]string{"format": "pt", "note": "ünïcode"}
	w, err := Create(path, md)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleTensors()
	for _, tt := range want {
		if err := w.Add(tt.name, tt.dtype, tt.shape, tt.bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("file exists before Close")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after Close, want only the file", len(entries))
	}
	for _, p := range []string{path, dir} {
		c, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		checkTensors(t, c, want)
		if !reflect.DeepEqual(c.Metadata(), md) {
			t.Errorf("Metadata() = %v, want %v", c.Metadata(), md)
		}
		if c.Dir() != dir {
			t.Errorf("Dir() = %q, want %q", c.Dir(), dir)
		}
		if !c.Has("f32") || c.Has("nope") {
			t.Error("Has is wrong")
		}
		_, err = c.Tensor("nope")
		if !errors.Is(err, ErrMissingTensor) || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), p) {
			t.Errorf("missing tensor error %q should wrap ErrMissingTensor and name the tensor and %s", err, p)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Tensor("f32"); !errors.Is(err, ErrClosed) {
			t.Errorf("Tensor after Close: %v, want ErrClosed", err)
		}
	}
	// The header is aligned so the data section starts at a multiple of 8.
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d not a multiple of 8", n)
	}
}

func TestWriterRejects(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.safetensors")
	w, err := Create(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add("a", F32, []int{2}, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		tname string
		dtype DType
		shape []int
		data  []byte
		want  error
	}{
		{"size mismatch", "b", F32, []int{2}, make([]byte, 7), ErrSizeMismatch},
		{"dtype mismatch", "b", BF16, []int{2}, make([]byte, 8), ErrSizeMismatch},
		{"negative dim", "b", U8, []int{-1}, nil, ErrSizeMismatch},
		{"duplicate", "a", F32, []int{2}, make([]byte, 8), ErrDuplicate},
		{"bad dtype", "b", DType(0), []int{1}, make([]byte, 1), ErrUnknownDType},
		{"empty name", "", U8, []int{1}, make([]byte, 1), ErrBadHeader},
		{"reserved name", "__metadata__", U8, []int{1}, make([]byte, 1), ErrBadHeader},
	}
	for _, tt := range tests {
		err := w.Add(tt.tname, tt.dtype, tt.shape, tt.data)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: Add error %v, want %v", tt.name, err, tt.want)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Add("c", U8, []int{1}, []byte{1}); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v, want ErrClosed", err)
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.Names(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Names() = %v, want [a]", got)
	}
}

func TestShardedWriter(t *testing.T) {
	want := sampleTensors()
	t.Run("several shards", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ckpt")
		s := NewShardedWriter(dir, 24, map[string]string{"format": "pt"})
		for _, tt := range want {
			if err := s.Add(tt.name, tt.dtype, tt.shape, tt.bytes()); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Add("f32", F32, []int{1}, make([]byte, 4)); !errors.Is(err, ErrDuplicate) {
			t.Errorf("duplicate across shards: %v, want ErrDuplicate", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(filepath.Join(dir, IndexFileName))
		if err != nil {
			t.Fatal(err)
		}
		var idx struct {
			Metadata  map[string]int64  `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &idx); err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, tt := range want {
			total += int64(len(tt.bytes()))
		}
		if idx.Metadata["total_size"] != total {
			t.Errorf("total_size %d, want %d", idx.Metadata["total_size"], total)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		shards, _ := filepath.Glob(filepath.Join(dir, "model-*-of-*.safetensors"))
		if len(shards) < 3 || len(files) != len(shards)+1 {
			t.Fatalf("files %v: want >= 3 shards plus the index and nothing else", files)
		}
		suffix := fmt.Sprintf("-of-%05d.safetensors", len(shards))
		for i, p := range shards {
			if want := fmt.Sprintf("model-%05d%s", i+1, suffix); filepath.Base(p) != want {
				t.Errorf("shard %d named %s, want %s", i, filepath.Base(p), want)
			}
		}
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		checkTensors(t, c, want)
		if c.Metadata()["format"] != "pt" {
			t.Errorf("Metadata() = %v", c.Metadata())
		}
		if len(c.Files()) != len(shards) {
			t.Errorf("Files() = %v", c.Files())
		}
	})
	t.Run("one shard", func(t *testing.T) {
		dir := t.TempDir()
		writeTemp(t, dir, IndexFileName, []byte(`{"weight_map":{"stale":"x.safetensors"}}`))
		writeAll(t, NewShardedWriter(dir, 1<<30, nil), want)
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		if len(files) != 1 || filepath.Base(files[0]) != SingleFileName {
			t.Fatalf("files %v, want only %s", files, SingleFileName)
		}
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		checkTensors(t, c, want)
	})
	t.Run("empty", func(t *testing.T) {
		dir := t.TempDir()
		if err := NewShardedWriter(dir, 100, nil).Close(); err != nil {
			t.Fatal(err)
		}
		c, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if len(c.Names()) != 0 {
			t.Errorf("Names() = %v", c.Names())
		}
	})
}

// writeShards writes files named in shards (name -> tensor names, each a U8
// [1] tensor) and an index from weightMap into dir.
func writeShards(t *testing.T, dir string, shards map[string][]string, index string) {
	t.Helper()
	for file, names := range shards {
		ts := make([]testTensor, len(names))
		for i, n := range names {
			ts[i] = testTensor{name: n, dtype: U8, shape: []int{1}, ints: []int64{7}}
		}
		writeFile(t, filepath.Join(dir, file), ts)
	}
	if index != "" {
		writeTemp(t, dir, IndexFileName, []byte(index))
	}
}

func TestOpenBadCheckpoints(t *testing.T) {
	tests := []struct {
		name   string
		shards map[string][]string
		index  string
		want   error
		tensor string
	}{
		{"duplicate across shards", map[string][]string{"a.safetensors": {"x"}, "b.safetensors": {"x"}},
			`{"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}`, ErrDuplicate, "x"},
		{"index names missing shard", map[string][]string{"a.safetensors": {"x"}},
			`{"weight_map":{"x":"a.safetensors","y":"gone.safetensors"}}`, ErrMissingShard, ""},
		{"tensor not in its shard", map[string][]string{"a.safetensors": {"x"}, "b.safetensors": {"y"}},
			`{"weight_map":{"x":"b.safetensors","y":"b.safetensors"}}`, ErrMissingTensor, "x"},
		{"tensor in no shard", map[string][]string{"a.safetensors": {"x"}},
			`{"weight_map":{"x":"a.safetensors","z":"a.safetensors"}}`, ErrMissingTensor, "z"},
		{"index not JSON", map[string][]string{"a.safetensors": {"x"}}, `{"weight_map":`, ErrBadIndex, ""},
		{"index not object", map[string][]string{"a.safetensors": {"x"}}, `[1]`, ErrBadIndex, ""},
		{"index without weight_map", map[string][]string{"a.safetensors": {"x"}}, `{"metadata":{}}`, ErrBadIndex, ""},
		{"index weight_map wrong type", map[string][]string{"a.safetensors": {"x"}}, `{"weight_map":{"x":1}}`, ErrBadIndex, ""},
		{"index escapes directory", map[string][]string{"a.safetensors": {"x"}},
			`{"weight_map":{"x":"../a.safetensors"}}`, ErrBadIndex, "x"},
		{"no checkpoint", nil, "", ErrNoCheckpoint, ""},
		{"ambiguous files", map[string][]string{"a.safetensors": {"x"}, "b.safetensors": {"y"}}, "", ErrNoCheckpoint, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeShards(t, dir, tt.shards, tt.index)
			c, err := Open(dir)
			if err == nil {
				c.Close()
				t.Fatal("no error")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("error %q, want %v", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %q is not an *Error", err)
			}
			if tt.tensor != "" && e.Tensor != tt.tensor {
				t.Errorf("error names tensor %q, want %q", e.Tensor, tt.tensor)
			}
		})
	}
	if _, err := Open(filepath.Join(t.TempDir(), "nope")); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("Open of a missing path: %v", err)
	}
}

func TestOpenShardedGood(t *testing.T) {
	dir := t.TempDir()
	writeShards(t, dir, map[string][]string{"a.safetensors": {"x", "w"}, "b.safetensors": {"y"}},
		`{"metadata":{"total_size":3},"weight_map":{"x":"a.safetensors","y":"b.safetensors","w":"a.safetensors"}}`)
	for _, p := range []string{dir, filepath.Join(dir, IndexFileName)} {
		c, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Names(); !slices.Equal(got, []string{"w", "x", "y"}) {
			t.Errorf("Names() = %v", got)
		}
		y, err := c.Tensor("y")
		if err != nil || y.File != filepath.Join(dir, "b.safetensors") {
			t.Errorf("Tensor(y) = %+v, %v", y, err)
		}
		c.Close()
	}
}

func TestTensorConversionErrors(t *testing.T) {
	tests := []struct {
		name string
		t    Tensor
		want error
	}{
		{"short data", Tensor{Name: "a", DType: F32, Shape: []int{2}, Data: make([]byte, 7)}, ErrSizeMismatch},
		{"long data", Tensor{Name: "a", DType: BF16, Shape: []int{2}, Data: make([]byte, 6)}, ErrSizeMismatch},
		{"negative shape", Tensor{Name: "a", DType: U8, Shape: []int{-2}, Data: nil}, ErrSizeMismatch},
		{"invalid dtype", Tensor{Name: "a", DType: 0, Shape: []int{1}, Data: make([]byte, 1)}, ErrUnknownDType},
	}
	for _, tt := range tests {
		if _, err := tt.t.Float32(); !errors.Is(err, tt.want) || !strings.Contains(err.Error(), `"a"`) {
			t.Errorf("%s: Float32 error %v, want %v naming the tensor", tt.name, err, tt.want)
		}
		if _, err := tt.t.Int64s(); !errors.Is(err, tt.want) {
			t.Errorf("%s: Int64s error %v, want %v", tt.name, err, tt.want)
		}
	}
	e8 := Tensor{Name: "e", DType: F8E8M0, Shape: []int{3}, Data: []byte{127, 130, 120}}
	if v, err := e8.Float32(); err != nil || v[0] != 1 || v[1] != 8 || v[2] != 1.0/128 {
		t.Errorf("Float32 of F8_E8M0 = %v, %v; want [1 8 0.0078125]", v, err)
	}
	u8 := Tensor{Name: "u", DType: U8, Shape: []int{1}, Data: []byte{1}}
	if _, err := u8.Float32(); !errors.Is(err, ErrDType) || !strings.Contains(err.Error(), "U8") {
		t.Errorf("Float32 of U8: %v, want ErrDType naming U8", err)
	}
}

func TestDType(t *testing.T) {
	for _, d := range []DType{F32, F16, BF16, F8E4M3, U8, I8, I32, I64, F64, I16, U16, U32, U64, Bool, F8E5M2, F8E8M0} {
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
		if d.Size() == 0 {
			t.Errorf("%v.Size() = 0", d)
		}
	}
	sizes := map[DType]int{F32: 4, F16: 2, BF16: 2, F8E4M3: 1, U8: 1, I8: 1, I32: 4, I64: 8}
	for d, n := range sizes {
		if d.Size() != n {
			t.Errorf("%v.Size() = %d, want %d", d, d.Size(), n)
		}
	}
	if _, err := ParseDType("F4"); !errors.Is(err, ErrUnknownDType) || !strings.Contains(err.Error(), "F4") {
		t.Errorf("ParseDType(F4) error %v should wrap ErrUnknownDType and name F4", err)
	}
	if DType(0).Valid() || DType(0).Size() != 0 || DType(200).String() != "DType(200)" {
		t.Error("invalid DType misbehaves")
	}
}

func TestConcurrentReads(t *testing.T) {
	dir := t.TempDir()
	want := sampleTensors()
	writeAll(t, NewShardedWriter(dir, 64, nil), want)
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error)
	for range 8 {
		go func() {
			for range 50 {
				for _, name := range c.Names() {
					tn, err := c.Tensor(name)
					if err != nil {
						done <- err
						return
					}
					if tn.DType == F32 || tn.DType == BF16 {
						if _, err := tn.Float32(); err != nil {
							done <- err
							return
						}
					}
				}
			}
			done <- nil
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestTruncatedFile cuts a valid file at every length: each prefix is
// rejected, and a cut inside the length prefix or the data is ErrTruncated.
func TestTruncatedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "full.safetensors")
	writeFile(t, path, sampleTensors()[:3])
	full, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dataStart := 8 + int(binary.LittleEndian.Uint64(full))
	for n := 0; n < len(full); n++ {
		_, err := parseFile("cut", full[:n])
		if err == nil {
			t.Fatalf("prefix of %d/%d bytes parsed", n, len(full))
		}
		if (n < 8 || n >= dataStart) && !errors.Is(err, ErrTruncated) {
			t.Errorf("prefix of %d bytes: %v, want ErrTruncated", n, err)
		}
	}
}
