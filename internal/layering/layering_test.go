package layering

import (
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestImportRules fails when a production file imports a package of its own
// layer in another folder tree or of a higher layer (see the package doc):
// layers importing backend or kernels, model importing kernels, anything
// importing the workbench.
func TestImportRules(t *testing.T) {
	root, module := moduleRoot(t)
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(rel))
		from, fromPrefix, ok := Of(pkg)
		if !ok {
			t.Errorf("%s: package %s has no layer: add its folder to layering.Layers", rel, pkg)
			return nil
		}
		if devOnly(f.Comments) {
			from, fromPrefix = Layers["dev"], "dev"
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != module && !strings.HasPrefix(p, module+"/") {
				continue
			}
			dep := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
			to, toPrefix, ok := Of(dep)
			if !ok {
				t.Errorf("%s imports %s, which has no layer", rel, dep)
				continue
			}
			checked++
			sameTree := strings.SplitN(fromPrefix, "/", 2)[0] == strings.SplitN(toPrefix, "/", 2)[0] && fromPrefix != "dev" && to < Layers["dev"]
			if to >= from && !(sameTree && to == from) {
				t.Errorf("%s (layer %d, %s) imports %s (layer %d, %s): a package imports only lower layers or its own tree", rel, from, fromPrefix, dep, to, toPrefix)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no import checked")
	}
}

// devOnly reports whether a file's build constraint requires the
// manifold_dev tag.
func devOnly(groups []*ast.CommentGroup) bool {
	for _, g := range groups {
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			e, err := constraint.Parse(c.Text)
			if err != nil {
				continue
			}
			host := func(dev bool) func(string) bool {
				return func(tag string) bool {
					if tag == "manifold_dev" {
						return dev
					}
					return tag == runtime.GOOS || tag == runtime.GOARCH || tag == "unix" || strings.HasPrefix(tag, "go1")
				}
			}
			if e.Eval(host(true)) && !e.Eval(host(false)) {
				return true
			}
		}
	}
	return false
}

func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

func moduleRoot(t *testing.T) (root, module string) {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if m, ok := strings.CutPrefix(line, "module "); ok {
					return dir, strings.TrimSpace(m)
				}
			}
			t.Fatal("go.mod names no module")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = parent
	}
}
