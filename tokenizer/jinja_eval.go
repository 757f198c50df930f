package tokenizer

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ---- Values ----
//
// Template values are nil (None), jUndefined, bool, int, float64, string,
// []jvalue (list), jTupleV, *jDict, *jNamespace, *jLoop, jFunc.

type jvalue = any

type jUndefined struct{ name string }

type jTupleV []jvalue

// jDict is a dict with string keys in insertion order.
type jDict struct {
	keys []string
	m    map[string]jvalue
}

func newDict() *jDict { return &jDict{m: map[string]jvalue{}} }

func (d *jDict) set(k string, v jvalue) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

type jNamespace struct{ d *jDict }

type jLoop struct {
	index0, length int
	items          []jvalue
}

type jFunc func(e *jeval, args []jvalue, kwargs map[string]jvalue) jvalue

type jRuntimeError struct{ msg string }

func (e *jRuntimeError) Error() string { return "chat template: " + e.msg }

func jfail(format string, a ...any) { panic(&jRuntimeError{fmt.Sprintf(format, a...)}) }

// ---- Scopes and control flow ----

type jscope struct {
	vars   map[string]jvalue
	parent *jscope
}

func (s *jscope) lookup(name string) (jvalue, bool) {
	for c := s; c != nil; c = c.parent {
		if v, ok := c.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

type jeval struct {
	out   *strings.Builder
	scope *jscope
	steps int
	calls int // macro calls under way
	depth int // eval calls under way
}

// maxCalls bounds nested macro calls, as Python's recursion limit bounds
// Jinja2's: a template calling itself for ever gets an error, not a stack
// overflow of the program rendering it.
const maxCalls = 1000

type loopSignal int

const (
	sigNone loopSignal = iota
	sigBreak
	sigContinue
)

// maxSteps bounds template work so a template cannot loop for ever.
const maxSteps = 10_000_000

// maxLen bounds a string (bytes) or list (items) that a template makes, and
// maxOutput what it renders, so that a template cannot exhaust memory
// ('x' * 10**12, a string doubled in a loop): far past any prompt's size.
const (
	maxLen    = 1 << 24
	maxOutput = 1 << 26
)

// checkLen fails when an operation would make a value of n bytes or items.
func checkLen(what string, n int) {
	if n < 0 || n > maxLen {
		jfail("%s would make a value of %d bytes or items (at most %d)", what, n, maxLen)
	}
}

// repeatLen is the length of n copies of something k long, for checkLen.
func repeatLen(k, n int) int {
	if n <= 0 || k == 0 {
		return 0
	}
	if k > maxLen/n {
		return maxLen + 1
	}
	return k * n
}

// write appends s to the output.
func (e *jeval) write(s string) {
	if e.out.Len()+len(s) > maxOutput {
		jfail("the rendered text would exceed %d bytes", maxOutput)
	}
	e.out.WriteString(s)
}

// replaceChecked is strings.Replace after checking the result's size.
func replaceChecked(s, old, nw string, n int) string {
	c := 0
	if len(old) == 0 {
		c = utf8.RuneCountInString(s) + 1
	} else if len(nw) > len(old) {
		c = strings.Count(s, old)
	}
	if n >= 0 && c > n {
		c = n
	}
	if len(nw) > len(old) {
		checkLen("replace", len(s)+repeatLen(len(nw)-len(old), c))
	}
	return strings.Replace(s, old, nw, n)
}

// joinChecked is strings.Join after checking the result's size.
func joinChecked(parts []string, sep string) string {
	n := repeatLen(len(sep), len(parts)-1)
	for _, p := range parts {
		n += len(p)
		if n > maxLen {
			break
		}
	}
	checkLen("join", n)
	return strings.Join(parts, sep)
}

// renderJinja renders parsed nodes with the given variables.
func renderJinja(nodes []jnode, vars map[string]jvalue) (out string, err error) {
	var sb strings.Builder
	e := &jeval{out: &sb, scope: &jscope{vars: map[string]jvalue{}}}
	for k, v := range jGlobals {
		e.scope.vars[k] = v
	}
	e.scope = &jscope{vars: vars, parent: e.scope}
	defer func() {
		if r := recover(); r != nil {
			switch x := r.(type) {
			case *jRuntimeError:
				err = x
			case *jRaised:
				err = x
			default:
				err = fmt.Errorf("chat template: internal error: %v", r)
			}
		}
	}()
	if e.execBody(nodes) != sigNone {
		jfail("break or continue outside a loop")
	}
	return sb.String(), nil
}

// jRaised is raise_exception(msg) from the template.
type jRaised struct{ msg string }

func (e *jRaised) Error() string { return "chat template raised: " + e.msg }

func (e *jeval) execBody(nodes []jnode) loopSignal {
	for _, n := range nodes {
		if s := e.exec(n); s != sigNone {
			return s
		}
	}
	return sigNone
}

func (e *jeval) exec(n jnode) loopSignal {
	e.steps++
	if e.steps > maxSteps {
		jfail("template exceeds %d steps", maxSteps)
	}
	switch n := n.(type) {
	case jTextNode:
		e.write(n.text)
	case jOutput:
		e.write(pyStr(e.eval(n.e)))
	case jIf:
		for i, c := range n.conds {
			if truthy(e.eval(c)) {
				return e.execBody(n.bodies[i])
			}
		}
		return e.execBody(n.els)
	case jFor:
		return e.execFor(n)
	case jSet:
		var v jvalue
		if n.body != nil || n.value == nil {
			saved := e.out
			var sb strings.Builder
			e.out = &sb
			e.execBody(n.body)
			e.out = saved
			v = sb.String()
		} else {
			v = e.eval(n.value)
		}
		if n.attr != "" {
			obj, ok := e.scope.lookup(n.target)
			ns, isNS := obj.(*jNamespace)
			if !ok || !isNS {
				jfail("cannot assign attribute %q of %s: not a namespace", n.attr, n.target)
			}
			ns.d.set(n.attr, v)
		} else {
			e.scope.vars[n.target] = v
		}
	case jBreak:
		return sigBreak
	case jContinue:
		return sigContinue
	case jMacroNode:
		e.scope.vars[n.name] = e.macro(n)
	default:
		jfail("unknown node %T", n)
	}
	return sigNone
}

func (e *jeval) macro(m jMacroNode) jFunc {
	def := e.scope
	return func(c *jeval, args []jvalue, kwargs map[string]jvalue) jvalue {
		if len(args) > len(m.params) {
			jfail("macro %s: too many arguments", m.name)
		}
		sc := &jscope{vars: map[string]jvalue{}, parent: def}
		for i, p := range m.params {
			switch {
			case i < len(args):
				sc.vars[p] = args[i]
			case kwargs[p] != nil:
				sc.vars[p] = kwargs[p]
			case m.defaults[i] != nil:
				saved := c.scope
				c.scope = sc
				sc.vars[p] = c.eval(m.defaults[i])
				c.scope = saved
			default:
				sc.vars[p] = jUndefined{p}
			}
		}
		for k := range kwargs {
			if _, ok := sc.vars[k]; !ok {
				jfail("macro %s: unexpected keyword argument %q", m.name, k)
			}
		}
		if c.calls >= maxCalls {
			jfail("macro %s: more than %d nested macro calls", m.name, maxCalls)
		}
		savedScope, savedOut := c.scope, c.out
		var sb strings.Builder
		c.scope, c.out = sc, &sb
		c.calls++
		c.execBody(m.body)
		c.calls--
		c.scope, c.out = savedScope, savedOut
		return sb.String()
	}
}

func (e *jeval) execFor(n jFor) loopSignal {
	items := iterate(e.eval(n.iter))
	outer := e.scope
	bind := func(sc *jscope, item jvalue) {
		if len(n.vars) == 1 {
			sc.vars[n.vars[0]] = item
			return
		}
		parts, ok := asSeq(item)
		if !ok || len(parts) != len(n.vars) {
			jfail("cannot unpack %s into %d loop variables", typeName(item), len(n.vars))
		}
		for i, v := range n.vars {
			sc.vars[v] = parts[i]
		}
	}
	if n.cond != nil {
		var kept []jvalue
		for _, it := range items {
			sc := &jscope{vars: map[string]jvalue{}, parent: outer}
			bind(sc, it)
			e.scope = sc
			if truthy(e.eval(n.cond)) {
				kept = append(kept, it)
			}
		}
		e.scope = outer
		items = kept
	}
	if len(items) == 0 {
		return e.execBody(n.els)
	}
	loop := &jLoop{length: len(items), items: items}
	defer func() { e.scope = outer }()
	for i, it := range items {
		// Each iteration gets a fresh scope: sets inside the body do not
		// leak out of the loop or into the next iteration (Jinja2 scoping).
		sc := &jscope{vars: map[string]jvalue{}, parent: outer}
		loop.index0 = i
		sc.vars["loop"] = loop
		bind(sc, it)
		e.scope = sc
		if e.execBody(n.body) == sigBreak {
			break
		}
	}
	return sigNone
}

// ---- Expressions ----

// eval evaluates an expression; its recursion depth is bounded by
// maxNesting, so that a deep expression gets an error, not a stack overflow.
func (e *jeval) eval(x jexpr) jvalue {
	e.depth++
	if e.depth > maxNesting {
		jfail("expression nested more than %d deep", maxNesting)
	}
	v := e.evalExpr(x)
	e.depth--
	return v
}

func (e *jeval) evalExpr(x jexpr) jvalue {
	switch x := x.(type) {
	case jLit:
		return x.v
	case jVar:
		if v, ok := e.scope.lookup(x.name); ok {
			return v
		}
		return jUndefined{x.name}
	case jAttr:
		return getAttr(e.eval(x.obj), x.name)
	case jIndex:
		return getItem(e.eval(x.obj), e.eval(x.idx))
	case jSlice:
		return slice(e.eval(x.obj), e.evalOpt(x.lo), e.evalOpt(x.hi), e.evalOpt(x.step))
	case jListLit:
		out := make([]jvalue, len(x.items))
		for i, it := range x.items {
			out[i] = e.eval(it)
		}
		return out
	case jTuple:
		out := make(jTupleV, len(x.items))
		for i, it := range x.items {
			out[i] = e.eval(it)
		}
		return out
	case jDictLit:
		d := newDict()
		for i, k := range x.keys {
			ks, ok := e.eval(k).(string)
			if !ok {
				jfail("dict keys must be strings")
			}
			d.set(ks, e.eval(x.vals[i]))
		}
		return d
	case jCall:
		fn := e.eval(x.fn)
		f, ok := fn.(jFunc)
		if !ok {
			if u, isU := fn.(jUndefined); isU {
				jfail("%q is undefined, cannot call it", u.name)
			}
			jfail("%s is not callable", typeName(fn))
		}
		return f(e, e.evalAll(nil, x.args), e.evalKwargs(x.kwargs))
	case jFilter:
		f := jFilters[x.name]
		return f(e, e.evalAll([]jvalue{e.eval(x.arg)}, x.args), e.evalKwargs(x.kwargs))
	case jTest:
		t := jTests[x.name]
		r := t(e, e.evalAll([]jvalue{e.eval(x.arg)}, x.args))
		if x.neg {
			return !r
		}
		return r
	case jUnary:
		v := e.eval(x.x)
		switch x.op {
		case "not":
			return !truthy(v)
		case "-":
			switch n := v.(type) {
			case int:
				return -n
			case float64:
				return -n
			case bool:
				return -b2i(n)
			}
			jfail("bad operand for unary -: %s", typeName(v))
		case "+":
			switch v.(type) {
			case int, float64:
				return v
			case bool:
				return b2i(v.(bool))
			}
			jfail("bad operand for unary +: %s", typeName(v))
		}
	case jCond:
		if truthy(e.eval(x.cond)) {
			return e.eval(x.yes)
		}
		return e.eval(x.no)
	case jBinary:
		switch x.op {
		case "and":
			l := e.eval(x.l)
			if !truthy(l) {
				return l
			}
			return e.eval(x.r)
		case "or":
			l := e.eval(x.l)
			if truthy(l) {
				return l
			}
			return e.eval(x.r)
		}
		return binary(x.op, e.eval(x.l), e.eval(x.r))
	}
	jfail("cannot evaluate %T", x)
	return nil
}

// evalAll appends the values of xs to dst, in order.
func (e *jeval) evalAll(dst []jvalue, xs []jexpr) []jvalue {
	for _, x := range xs {
		dst = append(dst, e.eval(x))
	}
	return dst
}

// evalKwargs evaluates keyword arguments into a map (empty, never nil).
func (e *jeval) evalKwargs(kws []jkwarg) map[string]jvalue {
	kw := make(map[string]jvalue, len(kws))
	for _, k := range kws {
		kw[k.name] = e.eval(k.v)
	}
	return kw
}

func (e *jeval) evalOpt(x jexpr) jvalue {
	if x == nil {
		return nil
	}
	return e.eval(x)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func typeName(v jvalue) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case jUndefined:
		return "Undefined"
	case bool:
		return "bool"
	case int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []jvalue:
		return "list"
	case jTupleV:
		return "tuple"
	case *jDict:
		return "dict"
	case *jNamespace:
		return "Namespace"
	case *jLoop:
		return "LoopContext"
	case jFunc:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v jvalue) bool {
	switch v := v.(type) {
	case nil, jUndefined:
		return false
	case bool:
		return v
	case int:
		return v != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case []jvalue:
		return len(v) > 0
	case jTupleV:
		return len(v) > 0
	case *jDict:
		return len(v.keys) > 0
	}
	return true
}

func asSeq(v jvalue) ([]jvalue, bool) {
	switch v := v.(type) {
	case []jvalue:
		return v, true
	case jTupleV:
		return v, true
	}
	return nil, false
}

// iterate returns the items a for loop visits.
func iterate(v jvalue) []jvalue {
	switch v := v.(type) {
	case []jvalue:
		return v
	case jTupleV:
		return v
	case *jDict:
		out := make([]jvalue, len(v.keys))
		for i, k := range v.keys {
			out[i] = k
		}
		return out
	case string:
		var out []jvalue
		for _, r := range v {
			out = append(out, string(r))
		}
		return out
	case jUndefined:
		return nil
	}
	jfail("%s is not iterable", typeName(v))
	return nil
}

func toInt(v jvalue, what string) int {
	switch n := v.(type) {
	case int:
		return n
	case bool:
		return b2i(n)
	}
	jfail("%s must be an integer, got %s", what, typeName(v))
	return 0
}

func getAttr(obj jvalue, name string) jvalue {
	switch o := obj.(type) {
	case jUndefined:
		jfail("%q is undefined (reading attribute %q)", o.name, name)
	case *jDict:
		if v, ok := o.m[name]; ok {
			return v
		}
		if m := dictMethod(o, name); m != nil {
			return m
		}
	case *jNamespace:
		if v, ok := o.d.m[name]; ok {
			return v
		}
	case *jLoop:
		return loopAttr(o, name)
	case string:
		if m := strMethod(o, name); m != nil {
			return m
		}
	case []jvalue:
		if m := listMethod(o, name); m != nil {
			return m
		}
	}
	return jUndefined{name}
}

func loopAttr(l *jLoop, name string) jvalue {
	i, n := l.index0, l.length
	switch name {
	case "index":
		return i + 1
	case "index0":
		return i
	case "revindex":
		return n - i
	case "revindex0":
		return n - i - 1
	case "first":
		return i == 0
	case "last":
		return i == n-1
	case "length":
		return n
	case "previtem":
		if i > 0 {
			return l.items[i-1]
		}
		return jUndefined{"previtem"}
	case "nextitem":
		if i < n-1 {
			return l.items[i+1]
		}
		return jUndefined{"nextitem"}
	case "depth":
		return 1
	case "depth0":
		return 0
	}
	jfail("loop.%s is not supported", name)
	return nil
}

func getItem(obj, idx jvalue) jvalue {
	switch o := obj.(type) {
	case jUndefined:
		jfail("%q is undefined (reading item %s)", o.name, pyRepr(idx))
	case *jDict:
		if k, ok := idx.(string); ok {
			if v, ok := o.m[k]; ok {
				return v
			}
		}
		return jUndefined{pyStr(idx)}
	case *jNamespace:
		if k, ok := idx.(string); ok {
			if v, ok := o.d.m[k]; ok {
				return v
			}
		}
		return jUndefined{pyStr(idx)}
	case string:
		if k, ok := idx.(string); ok {
			return getAttr(o, k)
		}
		rs := []rune(o)
		i := toInt(idx, "string index")
		if i < 0 {
			i += len(rs)
		}
		if i < 0 || i >= len(rs) {
			return jUndefined{"index"}
		}
		return string(rs[i])
	case []jvalue, jTupleV:
		if k, ok := idx.(string); ok {
			return getAttr(o, k)
		}
		s, _ := asSeq(o)
		i := toInt(idx, "list index")
		if i < 0 {
			i += len(s)
		}
		if i < 0 || i >= len(s) {
			return jUndefined{"index"}
		}
		return s[i]
	case *jLoop:
		if k, ok := idx.(string); ok {
			return loopAttr(o, k)
		}
	}
	return jUndefined{pyStr(idx)}
}

// sliceBounds is Python's slice.indices.
func sliceBounds(n int, lo, hi, step jvalue) (int, int, int) {
	st := 1
	if step != nil {
		st = toInt(step, "slice step")
		if st == 0 {
			jfail("slice step cannot be zero")
		}
	}
	clamp := func(v jvalue, def int) int {
		if v == nil {
			return def
		}
		i := toInt(v, "slice index")
		if i < 0 {
			i += n
			if i < 0 {
				if st < 0 {
					return -1
				}
				return 0
			}
		}
		if i >= n {
			if st < 0 {
				return n - 1
			}
			return n
		}
		return i
	}
	if st > 0 {
		return clamp(lo, 0), clamp(hi, n), st
	}
	return clamp(lo, n-1), clamp(hi, -1), st
}

func sliceIdx(n int, lo, hi, step jvalue) []int {
	a, b, st := sliceBounds(n, lo, hi, step)
	var out []int
	if st > 0 {
		for i := a; i < b; i += st {
			out = append(out, i)
		}
	} else {
		for i := a; i > b; i += st {
			out = append(out, i)
		}
	}
	return out
}

func slice(obj, lo, hi, step jvalue) jvalue {
	switch o := obj.(type) {
	case string:
		rs := []rune(o)
		var sb strings.Builder
		for _, i := range sliceIdx(len(rs), lo, hi, step) {
			sb.WriteRune(rs[i])
		}
		return sb.String()
	case []jvalue, jTupleV:
		s, _ := asSeq(o)
		out := []jvalue{}
		for _, i := range sliceIdx(len(s), lo, hi, step) {
			out = append(out, s[i])
		}
		if _, ok := o.(jTupleV); ok {
			return jTupleV(out)
		}
		return out
	case jUndefined:
		jfail("%q is undefined (slicing it)", o.name)
	}
	jfail("cannot slice %s", typeName(obj))
	return nil
}

func isNum(v jvalue) bool {
	switch v.(type) {
	case int, float64, bool:
		return true
	}
	return false
}

func toFloat(v jvalue) float64 {
	switch n := v.(type) {
	case int:
		return float64(n)
	case float64:
		return n
	case bool:
		return float64(b2i(n))
	}
	return math.NaN()
}

func isIntLike(v jvalue) bool {
	switch v.(type) {
	case int, bool:
		return true
	}
	return false
}

func equal(a, b jvalue) bool {
	if isNum(a) && isNum(b) {
		if isIntLike(a) && isIntLike(b) {
			return toInt(a, "") == toInt(b, "")
		}
		return toFloat(a) == toFloat(b)
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case jUndefined:
		_, ok := b.(jUndefined)
		return ok
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []jvalue:
		y, ok := b.([]jvalue)
		return ok && seqEqual(x, y)
	case jTupleV:
		y, ok := b.(jTupleV)
		return ok && seqEqual(x, y)
	case *jDict:
		y, ok := b.(*jDict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for k, v := range x.m {
			w, ok := y.m[k]
			if !ok || !equal(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

func seqEqual(x, y []jvalue) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if !equal(x[i], y[i]) {
			return false
		}
	}
	return true
}

func compare(op string, a, b jvalue) bool {
	var c int
	switch {
	case isNum(a) && isNum(b):
		fa, fb := toFloat(a), toFloat(b)
		switch {
		case fa < fb:
			c = -1
		case fa > fb:
			c = 1
		}
	default:
		sa, ok1 := a.(string)
		sb, ok2 := b.(string)
		if !ok1 || !ok2 {
			jfail("'%s' not supported between %s and %s", op, typeName(a), typeName(b))
		}
		c = strings.Compare(sa, sb)
	}
	switch op {
	case "<":
		return c < 0
	case "<=":
		return c <= 0
	case ">":
		return c > 0
	}
	return c >= 0
}

func contains(container, item jvalue) bool {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			jfail("'in <string>' requires a string, not %s", typeName(item))
		}
		return strings.Contains(c, s)
	case []jvalue, jTupleV:
		s, _ := asSeq(c)
		for _, x := range s {
			if equal(x, item) {
				return true
			}
		}
		return false
	case *jDict:
		k, ok := item.(string)
		_, has := c.m[k]
		return ok && has
	case jUndefined:
		jfail("%q is undefined (testing membership)", c.name)
	}
	jfail("argument of type %s is not iterable", typeName(container))
	return false
}

func binary(op string, a, b jvalue) jvalue {
	switch op {
	case "==":
		return equal(a, b)
	case "!=":
		return !equal(a, b)
	case "<", "<=", ">", ">=":
		return compare(op, a, b)
	case "in":
		return contains(b, a)
	case "not in":
		return !contains(b, a)
	case "~":
		x, y := pyStr(a), pyStr(b)
		checkLen("~", len(x)+len(y))
		return x + y
	}
	if u, ok := a.(jUndefined); ok {
		jfail("%q is undefined (operand of %s)", u.name, op)
	}
	if u, ok := b.(jUndefined); ok {
		jfail("%q is undefined (operand of %s)", u.name, op)
	}
	if isNum(a) && isNum(b) {
		ints := isIntLike(a) && isIntLike(b)
		if ints {
			x, y := toInt(a, ""), toInt(b, "")
			if r, ok := ringOp(op, x, y, "integer "); ok {
				return r
			}
			switch op {
			case "//":
				q := x / y
				if (x%y != 0) && ((x < 0) != (y < 0)) {
					q--
				}
				return q
			case "%":
				return floorMod(x%y, y)
			case "**":
				if y >= 0 {
					r := 1
					for range y {
						r *= x
					}
					return r
				}
			}
		}
		x, y := toFloat(a), toFloat(b)
		if r, ok := ringOp(op, x, y, ""); ok {
			return r
		}
		switch op {
		case "/":
			if y == 0 {
				jfail("division by zero")
			}
			return x / y
		case "//":
			return math.Floor(x / y)
		case "%":
			return floorMod(math.Mod(x, y), y)
		case "**":
			return math.Pow(x, y)
		}
	}
	switch op {
	case "+":
		if x, ok := a.(string); ok {
			if y, ok := b.(string); ok {
				checkLen("+", len(x)+len(y))
				return x + y
			}
		}
		if x, ok := a.([]jvalue); ok {
			if y, ok := b.([]jvalue); ok {
				checkLen("+", len(x)+len(y))
				return append(append([]jvalue{}, x...), y...)
			}
		}
		if x, ok := a.(jTupleV); ok {
			if y, ok := b.(jTupleV); ok {
				checkLen("+", len(x)+len(y))
				return append(append(jTupleV{}, x...), y...)
			}
		}
	case "*":
		if s, ok := a.(string); ok && isIntLike(b) {
			n := max(0, toInt(b, ""))
			checkLen("*", repeatLen(len(s), n))
			return strings.Repeat(s, n)
		}
		if s, ok := b.(string); ok && isIntLike(a) {
			n := max(0, toInt(a, ""))
			checkLen("*", repeatLen(len(s), n))
			return strings.Repeat(s, n)
		}
		if l, ok := a.([]jvalue); ok && isIntLike(b) {
			n := max(0, toInt(b, ""))
			checkLen("*", repeatLen(len(l), n))
			var out []jvalue
			for range n {
				out = append(out, l...)
			}
			return out
		}
	case "%":
		if _, ok := a.(string); ok {
			jfail("printf-style string formatting is not supported")
		}
	}
	jfail("unsupported operand types for %s: %s and %s", op, typeName(a), typeName(b))
	return nil
}

// ---- Python str() and repr() ----

func pyStr(v jvalue) string {
	switch v := v.(type) {
	case string:
		return v
	case jUndefined:
		return ""
	}
	return pyRepr(v)
}

func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	exp := int(math.Floor(math.Log10(math.Abs(f))))
	// Log10 can be off by one near powers of ten; check with the shortest
	// decimal form.
	es := strconv.FormatFloat(f, 'e', -1, 64)
	if k := strings.IndexByte(es, 'e'); k >= 0 {
		exp, _ = strconv.Atoi(es[k+1:])
	}
	if exp < -4 || exp >= 16 {
		mant, e, _ := strings.Cut(es, "e")
		sign := e[0]
		digits := strings.TrimLeft(e[1:], "0")
		if len(digits) < 2 {
			digits = strings.Repeat("0", 2-len(digits)) + digits
		}
		return mant + "e" + string(sign) + digits
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

func pyReprString(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, "\"") {
		q = '"'
	}
	var sb strings.Builder
	sb.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		case r >= 0x80 && !unicode.IsPrint(r) && r != ' ':
			switch {
			case r <= 0xff:
				fmt.Fprintf(&sb, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(&sb, `\u%04x`, r)
			default:
				fmt.Fprintf(&sb, `\U%08x`, r)
			}
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte(q)
	return sb.String()
}

func pyRepr(v jvalue) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case jUndefined:
		return ""
	case bool:
		if v {
			return "True"
		}
		return "False"
	case int:
		return strconv.Itoa(v)
	case float64:
		return pyFloat(v)
	case string:
		return pyReprString(v)
	case []jvalue:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = pyRepr(x)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case jTupleV:
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = pyRepr(x)
		}
		if len(v) == 1 {
			return "(" + parts[0] + ",)"
		}
		return "(" + strings.Join(parts, ", ") + ")"
	case *jDict:
		parts := make([]string, len(v.keys))
		for i, k := range v.keys {
			parts[i] = pyReprString(k) + ": " + pyRepr(v.m[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	jfail("cannot print a %s", typeName(v))
	return ""
}

// ---- JSON (Python json.dumps, ensure_ascii=False) ----

func jsonString(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(sb, `\u%04x`, r)
			} else {
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

type jsonOpts struct {
	indent          string
	hasIndent       bool
	itemSep, keySep string
	sortKeys        bool
}

func toJSON(sb *strings.Builder, v jvalue, o *jsonOpts, depth int) {
	nl := func(d int) {
		if o.hasIndent {
			sb.WriteByte('\n')
			checkLen("tojson", sb.Len()+repeatLen(len(o.indent), d))
			sb.WriteString(strings.Repeat(o.indent, d))
		}
	}
	switch x := v.(type) {
	case nil:
		sb.WriteString("null")
	case bool:
		if x {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case int:
		sb.WriteString(strconv.Itoa(x))
	case float64:
		switch {
		case math.IsInf(x, 1):
			sb.WriteString("Infinity")
		case math.IsInf(x, -1):
			sb.WriteString("-Infinity")
		case math.IsNaN(x):
			sb.WriteString("NaN")
		default:
			sb.WriteString(pyFloat(x))
		}
	case string:
		jsonString(sb, x)
	case []jvalue, jTupleV:
		s, _ := asSeq(x)
		if len(s) == 0 {
			sb.WriteString("[]")
			return
		}
		sb.WriteByte('[')
		for i, it := range s {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			nl(depth + 1)
			toJSON(sb, it, o, depth+1)
		}
		nl(depth)
		sb.WriteByte(']')
	case *jDict:
		if len(x.keys) == 0 {
			sb.WriteString("{}")
			return
		}
		keys := x.keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			nl(depth + 1)
			jsonString(sb, k)
			sb.WriteString(o.keySep)
			toJSON(sb, x.m[k], o, depth+1)
		}
		nl(depth)
		sb.WriteByte('}')
	case jUndefined:
		jfail("%q is undefined (tojson)", x.name)
	default:
		jfail("Object of type %s is not JSON serializable", typeName(v))
	}
}

// ---- Globals ----

var jGlobals = map[string]jvalue{
	"raise_exception": jFunc(func(_ *jeval, args []jvalue, _ map[string]jvalue) jvalue {
		msg := ""
		if len(args) > 0 {
			msg = pyStr(args[0])
		}
		panic(&jRaised{msg})
	}),
	"namespace": jFunc(func(_ *jeval, args []jvalue, kw map[string]jvalue) jvalue {
		d := newDict()
		if len(args) > 0 {
			src, ok := args[0].(*jDict)
			if !ok {
				jfail("namespace() takes a dict")
			}
			for _, k := range src.keys {
				d.set(k, src.m[k])
			}
		}
		for _, k := range sortedKwargs(kw) {
			d.set(k, kw[k])
		}
		return &jNamespace{d}
	}),
	"range": jFunc(func(_ *jeval, args []jvalue, _ map[string]jvalue) jvalue {
		lo, hi, st := 0, 0, 1
		switch len(args) {
		case 1:
			hi = toInt(args[0], "range stop")
		case 2:
			lo, hi = toInt(args[0], "range start"), toInt(args[1], "range stop")
		case 3:
			lo, hi, st = toInt(args[0], "range start"), toInt(args[1], "range stop"), toInt(args[2], "range step")
		default:
			jfail("range takes 1 to 3 arguments")
		}
		if st == 0 {
			jfail("range step cannot be zero")
		}
		var out []jvalue
		for i := lo; st > 0 && i < hi || st < 0 && i > hi; i += st {
			out = append(out, i)
			if len(out) > 1_000_000 {
				jfail("range too large")
			}
		}
		return out
	}),
	"strftime_now": jFunc(func(_ *jeval, args []jvalue, _ map[string]jvalue) jvalue {
		if len(args) != 1 {
			jfail("strftime_now takes one format")
		}
		f, ok := args[0].(string)
		if !ok {
			jfail("strftime_now format must be a string")
		}
		return strftime(time.Now(), f)
	}),
	"dict": jFunc(func(_ *jeval, args []jvalue, kw map[string]jvalue) jvalue {
		if len(args) > 0 {
			jfail("dict() with positional arguments is not supported")
		}
		d := newDict()
		for _, k := range sortedKwargs(kw) {
			d.set(k, kw[k])
		}
		return d
	}),
}

// sortedKwargs orders keyword arguments. Python keeps call order; the
// parser does not, so namespace/dict attributes are ordered by name, which
// only matters if the template prints the whole namespace.
func sortedKwargs(kw map[string]jvalue) []string {
	keys := make([]string, 0, len(kw))
	for k := range kw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func strftime(t time.Time, f string) string {
	var sb strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			sb.WriteByte(f[i])
			continue
		}
		i++
		switch c := f[i]; c {
		case 'Y':
			fmt.Fprintf(&sb, "%04d", t.Year())
		case 'm', 'd', 'H', 'M', 'S':
			n := map[byte]int{'m': int(t.Month()), 'd': t.Day(), 'H': t.Hour(), 'M': t.Minute(), 'S': t.Second()}[c]
			fmt.Fprintf(&sb, "%02d", n)
		case 'B', 'b', 'A', 'a':
			name := t.Month().String()
			if c == 'A' || c == 'a' {
				name = t.Weekday().String()
			}
			if c == 'b' || c == 'a' {
				name = name[:3] // the abbreviated name
			}
			sb.WriteString(name)
		case '%':
			sb.WriteByte('%')
		default:
			jfail("strftime_now: unsupported directive %%%c", f[i])
		}
	}
	return sb.String()
}

func runeLen(s string) int { return utf8.RuneCountInString(s) }

// ringOp applies +, - or * to two numbers of one kind, and fails on a zero
// divisor of // or % (kind, "integer " or "", names ints in the error);
// ok is false for every other op, which the caller applies.
func ringOp[T int | float64](op string, x, y T, kind string) (r T, ok bool) {
	switch op {
	case "+":
		return x + y, true
	case "-":
		return x - y, true
	case "*":
		return x * y, true
	case "//":
		if y == 0 {
			jfail("%sdivision by zero", kind)
		}
	case "%":
		if y == 0 {
			jfail("%smodulo by zero", kind)
		}
	}
	return 0, false
}

// floorMod turns the remainder m of a division by y (the sign of the
// dividend, as Go's % and math.Mod give) into Python's (the sign of y).
func floorMod[T int | float64](m, y T) T {
	if m != 0 && (m < 0) != (y < 0) {
		m += y
	}
	return m
}
