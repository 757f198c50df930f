package tokenizer

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

type jFilterFunc func(e *jeval, args []jvalue, kw map[string]jvalue) jvalue
type jTestFunc func(e *jeval, args []jvalue) bool

func argN(args []jvalue, kw map[string]jvalue, i int, name string, def jvalue) jvalue {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kw[name]; ok {
		return v
	}
	return def
}

func wantStr(v jvalue, what string) string {
	switch s := v.(type) {
	case string:
		return s
	case jUndefined:
		jfail("%q is undefined (%s)", s.name, what)
	}
	jfail("%s: expected a string, got %s", what, typeName(v))
	return ""
}

func checkKwargs(name string, kw map[string]jvalue, allowed ...string) {
	for k := range kw {
		ok := false
		for _, a := range allowed {
			ok = ok || a == k
		}
		if !ok {
			jfail("%s: unsupported keyword argument %q", name, k)
		}
	}
}

func length(v jvalue) int {
	switch x := v.(type) {
	case string:
		return runeLen(x)
	case []jvalue:
		return len(x)
	case jTupleV:
		return len(x)
	case *jDict:
		return len(x.keys)
	case jUndefined:
		return 0
	}
	jfail("object of type %s has no len()", typeName(v))
	return 0
}

var jFilters map[string]jFilterFunc

var jTests map[string]jTestFunc

func init() {
	jFilters = map[string]jFilterFunc{
		"tojson": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			checkKwargs("tojson", kw, "indent", "ensure_ascii", "separators", "sort_keys")
			o := &jsonOpts{itemSep: ", ", keySep: ": "}
			switch ind := argN(a, kw, 1, "indent", nil).(type) {
			case nil:
			case int:
				checkLen("tojson indent", max(ind, 0)) // a negative indent is 0, as in Python
				o.indent, o.hasIndent, o.itemSep = strings.Repeat(" ", max(ind, 0)), true, ","
			case string:
				o.indent, o.hasIndent, o.itemSep = ind, true, ","
			default:
				jfail("tojson: bad indent %s", pyRepr(ind))
			}
			if ea, ok := kw["ensure_ascii"]; ok && truthy(ea) {
				jfail("tojson: ensure_ascii=True is not supported")
			}
			if sep, ok := kw["separators"]; ok && sep != nil {
				s, ok := asSeq(sep)
				if !ok || len(s) != 2 {
					jfail("tojson: separators must be a pair")
				}
				o.itemSep, o.keySep = wantStr(s[0], "separators"), wantStr(s[1], "separators")
			}
			o.sortKeys = truthy(kw["sort_keys"])
			var sb strings.Builder
			toJSON(&sb, a[0], o, 0)
			return sb.String()
		},
		"trim": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			s := pyStr(a[0])
			if c := argN(a, kw, 1, "chars", nil); c != nil {
				return strings.Trim(s, wantStr(c, "trim"))
			}
			return strings.TrimFunc(s, unicode.IsSpace)
		},
		"length": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return length(a[0]) },
		"upper":  func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return strings.ToUpper(pyStr(a[0])) },
		"lower":  func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return strings.ToLower(pyStr(a[0])) },
		"capitalize": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			return pyCapitalize(pyStr(a[0]))
		},
		"string": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return pyStr(a[0]) },
		"safe":   func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return a[0] },
		"first": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			s := iterate(a[0])
			if len(s) == 0 {
				return jUndefined{"first"}
			}
			return s[0]
		},
		"last": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			s := iterate(a[0])
			if len(s) == 0 {
				return jUndefined{"last"}
			}
			return s[len(s)-1]
		},
		"list": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			return append([]jvalue{}, iterate(a[0])...)
		},
		"reverse": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			if s, ok := a[0].(string); ok {
				return slice(s, nil, nil, -1)
			}
			s := iterate(a[0])
			out := make([]jvalue, len(s))
			for i, x := range s {
				out[len(s)-1-i] = x
			}
			return out
		},
		"join": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			checkKwargs("join", kw, "d", "attribute")
			sep := pyStr(argN(a, kw, 1, "d", ""))
			attr := argN(a, kw, 2, "attribute", nil)
			var parts []string
			for _, x := range iterate(a[0]) {
				if attr != nil {
					x = getAttr(x, pyStr(attr))
				}
				parts = append(parts, pyStr(x))
			}
			return joinChecked(parts, sep)
		},
		"default": filterDefault,
		"d":       filterDefault,
		"replace": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			s := pyStr(a[0])
			old, nw := wantStr(argN(a, kw, 1, "old", nil), "replace"), wantStr(argN(a, kw, 2, "new", nil), "replace")
			n := -1
			if c := argN(a, kw, 3, "count", nil); c != nil {
				n = toInt(c, "replace count")
			}
			return replaceChecked(s, old, nw, n)
		},
		"int": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			switch x := a[0].(type) {
			case int:
				return x
			case bool:
				return b2i(x)
			case float64:
				return int(x)
			case string:
				if n, err := strconv.Atoi(strings.TrimSpace(x)); err == nil {
					return n
				}
				if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
					return int(f)
				}
			}
			return argN(a, kw, 1, "default", 0)
		},
		"float": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			switch x := a[0].(type) {
			case int, bool, float64:
				return toFloat(x)
			case string:
				if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil {
					return f
				}
			}
			return argN(a, kw, 1, "default", 0.0)
		},
		"abs": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			switch x := a[0].(type) {
			case int:
				if x < 0 {
					return -x
				}
				return x
			case float64:
				return math.Abs(x)
			}
			jfail("abs: bad operand %s", typeName(a[0]))
			return nil
		},
		"items": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			d, ok := a[0].(*jDict)
			if !ok {
				if _, u := a[0].(jUndefined); u {
					return []jvalue{}
				}
				jfail("items: expected a dict, got %s", typeName(a[0]))
			}
			return dictItems(d)
		},
		"dictsort": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			checkKwargs("dictsort", kw, "case_sensitive")
			d, ok := a[0].(*jDict)
			if !ok {
				jfail("dictsort: expected a dict")
			}
			items := dictItems(d)
			cs := truthy(argN(a, kw, 1, "case_sensitive", false))
			sort.SliceStable(items, func(i, j int) bool {
				x, y := items[i].(jTupleV)[0].(string), items[j].(jTupleV)[0].(string)
				if !cs {
					x, y = strings.ToLower(x), strings.ToLower(y)
				}
				return x < y
			})
			return items
		},
		"indent": func(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			checkKwargs("indent", kw, "width", "first", "blank")
			s := pyStr(a[0])
			w := argN(a, kw, 1, "width", 4)
			pad := ""
			if ws, ok := w.(string); ok {
				pad = ws
			} else {
				n := toInt(w, "indent width")
				checkLen("indent", n)
				pad = strings.Repeat(" ", n)
			}
			first := truthy(argN(a, kw, 2, "first", false))
			blank := truthy(argN(a, kw, 3, "blank", false))
			lines := strings.Split(s, "\n")
			checkLen("indent", len(s)+repeatLen(len(pad), len(lines)))
			for i := range lines {
				if i == 0 && !first || !blank && strings.TrimSpace(lines[i]) == "" && i > 0 {
					continue
				}
				lines[i] = pad + lines[i]
			}
			return strings.Join(lines, "\n")
		},
		"count": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return length(a[0]) },
		"select": func(e *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			return selectFilter(e, a, kw, true, false)
		},
		"reject": func(e *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			return selectFilter(e, a, kw, false, false)
		},
		"selectattr": func(e *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			return selectFilter(e, a, kw, true, true)
		},
		"rejectattr": func(e *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			return selectFilter(e, a, kw, false, true)
		},
		"map": func(e *jeval, a []jvalue, kw map[string]jvalue) jvalue {
			items := iterate(a[0])
			out := make([]jvalue, 0, len(items))
			if attr, ok := kw["attribute"]; ok {
				checkKwargs("map", kw, "attribute", "default")
				for _, x := range items {
					v := getAttr(x, pyStr(attr))
					if _, u := v.(jUndefined); u {
						if d, ok := kw["default"]; ok {
							v = d
						}
					}
					out = append(out, v)
				}
				return out
			}
			if len(a) < 2 {
				jfail("map: needs a filter name or attribute=")
			}
			name := wantStr(a[1], "map")
			f, ok := jFilters[name]
			if !ok {
				jfail("map: unsupported filter %q", name)
			}
			for _, x := range items {
				out = append(out, f(e, append([]jvalue{x}, a[2:]...), kw))
			}
			return out
		},
		"unique": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			var out []jvalue
			for _, x := range iterate(a[0]) {
				dup := false
				for _, y := range out {
					dup = dup || equal(x, y)
				}
				if !dup {
					out = append(out, x)
				}
			}
			return out
		},
		"sum": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			var acc jvalue = 0
			for _, x := range iterate(a[0]) {
				acc = binary("+", acc, x)
			}
			return acc
		},
		"min": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return minMax(a[0], "<") },
		"max": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue { return minMax(a[0], ">") },
		"title": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			return pyTitle(pyStr(a[0]))
		},
		"wordcount": func(_ *jeval, a []jvalue, _ map[string]jvalue) jvalue {
			return len(strings.Fields(pyStr(a[0])))
		},
	}
	jTests = map[string]jTestFunc{
		"defined":   func(_ *jeval, a []jvalue) bool { _, u := a[0].(jUndefined); return !u },
		"undefined": func(_ *jeval, a []jvalue) bool { _, u := a[0].(jUndefined); return u },
		"none":      func(_ *jeval, a []jvalue) bool { return a[0] == nil },
		"string":    func(_ *jeval, a []jvalue) bool { _, ok := a[0].(string); return ok },
		"number": func(_ *jeval, a []jvalue) bool {
			switch a[0].(type) {
			case int, float64, bool:
				return true
			}
			return false
		},
		"integer": func(_ *jeval, a []jvalue) bool { _, ok := a[0].(int); return ok },
		"float":   func(_ *jeval, a []jvalue) bool { _, ok := a[0].(float64); return ok },
		"boolean": func(_ *jeval, a []jvalue) bool { _, ok := a[0].(bool); return ok },
		"true":    func(_ *jeval, a []jvalue) bool { b, ok := a[0].(bool); return ok && b },
		"false":   func(_ *jeval, a []jvalue) bool { b, ok := a[0].(bool); return ok && !b },
		"mapping": func(_ *jeval, a []jvalue) bool {
			switch a[0].(type) {
			case *jDict:
				return true
			}
			return false
		},
		"iterable": func(_ *jeval, a []jvalue) bool {
			switch a[0].(type) {
			case string, []jvalue, jTupleV, *jDict:
				return true
			}
			return false
		},
		"sequence": func(_ *jeval, a []jvalue) bool {
			switch a[0].(type) {
			case string, []jvalue, jTupleV, *jDict:
				return true
			}
			return false
		},
		"callable": func(_ *jeval, a []jvalue) bool { _, ok := a[0].(jFunc); return ok },
		"even":     func(_ *jeval, a []jvalue) bool { return toInt(a[0], "even")%2 == 0 },
		"odd":      func(_ *jeval, a []jvalue) bool { return toInt(a[0], "odd")%2 != 0 },
		"divisibleby": func(_ *jeval, a []jvalue) bool {
			need(a, 2, "divisibleby")
			d := toInt(a[1], "divisibleby")
			if d == 0 {
				jfail("divisibleby zero")
			}
			return toInt(a[0], "divisibleby")%d == 0
		},
		"eq":          cmpTest("=="),
		"equalto":     cmpTest("=="),
		"==":          cmpTest("=="),
		"ne":          cmpTest("!="),
		"!=":          cmpTest("!="),
		"lt":          cmpTest("<"),
		"lessthan":    cmpTest("<"),
		"<":           cmpTest("<"),
		"le":          cmpTest("<="),
		"<=":          cmpTest("<="),
		"gt":          cmpTest(">"),
		"greaterthan": cmpTest(">"),
		">":           cmpTest(">"),
		"ge":          cmpTest(">="),
		">=":          cmpTest(">="),
		"in": func(_ *jeval, a []jvalue) bool {
			need(a, 2, "in")
			return contains(a[1], a[0])
		},
		"sameas": func(_ *jeval, a []jvalue) bool {
			need(a, 2, "sameas")
			switch x := a[0].(type) {
			case nil, bool:
				return a[1] == x
			}
			return equal(a[0], a[1])
		},
		"lower": func(_ *jeval, a []jvalue) bool {
			s, ok := a[0].(string)
			return ok && s == strings.ToLower(s)
		},
		"upper": func(_ *jeval, a []jvalue) bool {
			s, ok := a[0].(string)
			return ok && s == strings.ToUpper(s)
		},
	}
}

func need(a []jvalue, n int, name string) {
	if len(a) < n {
		jfail("test %s needs an argument", name)
	}
}

func cmpTest(op string) jTestFunc {
	return func(_ *jeval, a []jvalue) bool {
		need(a, 2, op)
		return truthy(binary(op, a[0], a[1]))
	}
}

func filterDefault(_ *jeval, a []jvalue, kw map[string]jvalue) jvalue {
	checkKwargs("default", kw, "default_value", "boolean")
	def := argN(a, kw, 1, "default_value", "")
	boolean := truthy(argN(a, kw, 2, "boolean", false))
	if _, u := a[0].(jUndefined); u || boolean && !truthy(a[0]) {
		return def
	}
	return a[0]
}

func selectFilter(e *jeval, a []jvalue, kw map[string]jvalue, keep, attr bool) jvalue {
	if len(kw) > 0 {
		jfail("select/reject filters take no keyword arguments")
	}
	items := iterate(a[0])
	rest := a[1:]
	var attrName string
	if attr {
		if len(rest) == 0 {
			jfail("selectattr/rejectattr need an attribute name")
		}
		attrName, rest = wantStr(rest[0], "attribute"), rest[1:]
	}
	var test jTestFunc
	if len(rest) > 0 {
		name := wantStr(rest[0], "test name")
		t, ok := jTests[name]
		if !ok {
			jfail("unsupported test %q", name)
		}
		test, rest = t, rest[1:]
	}
	out := []jvalue{}
	for _, x := range items {
		v := x
		if attr {
			v = getAttr(x, attrName)
		}
		var ok bool
		if test == nil {
			ok = truthy(v)
		} else {
			ok = test(e, append([]jvalue{v}, rest...))
		}
		if ok == keep {
			out = append(out, x)
		}
	}
	return out
}

func minMax(v jvalue, op string) jvalue {
	items := iterate(v)
	if len(items) == 0 {
		return jUndefined{"min/max of empty sequence"}
	}
	best := items[0]
	for _, x := range items[1:] {
		if compare(op, x, best) {
			best = x
		}
	}
	return best
}

func dictItems(d *jDict) []jvalue {
	out := make([]jvalue, len(d.keys))
	for i, k := range d.keys {
		out[i] = jTupleV{k, d.m[k]}
	}
	return out
}

func pyCapitalize(s string) string {
	rs := []rune(strings.ToLower(s))
	if len(rs) > 0 {
		rs[0] = unicode.ToUpper(rs[0])
	}
	return string(rs)
}

func pyTitle(s string) string {
	var sb strings.Builder
	prevCased := false
	for _, r := range s {
		if prevCased {
			sb.WriteRune(unicode.ToLower(r))
		} else {
			sb.WriteRune(unicode.ToTitle(r))
		}
		prevCased = unicode.IsLetter(r)
	}
	return sb.String()
}

func method(f func(args []jvalue, kw map[string]jvalue) jvalue) jFunc {
	return func(_ *jeval, args []jvalue, kw map[string]jvalue) jvalue { return f(args, kw) }
}

// pyStrip is str.strip/lstrip/rstrip: whitespace by default, else the
// characters of chars.
func pyStrip(s string, args []jvalue, left, right bool) string {
	var chars jvalue
	if len(args) > 0 {
		chars = args[0]
	}
	if chars == nil {
		if left {
			s = strings.TrimLeftFunc(s, unicode.IsSpace)
		}
		if right {
			s = strings.TrimRightFunc(s, unicode.IsSpace)
		}
		return s
	}
	cs := wantStr(chars, "strip chars")
	if left {
		s = strings.TrimLeft(s, cs)
	}
	if right {
		s = strings.TrimRight(s, cs)
	}
	return s
}

func strMethod(s, name string) jvalue {
	switch name {
	case "strip", "lstrip", "rstrip":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			return pyStrip(s, a, name != "rstrip", name != "lstrip")
		})
	case "split", "rsplit":
		return method(func(a []jvalue, kw map[string]jvalue) jvalue {
			sep := argN(a, kw, 0, "sep", nil)
			n := -1
			if m := argN(a, kw, 1, "maxsplit", nil); m != nil {
				n = toInt(m, "maxsplit")
			}
			var parts []string
			if sep == nil {
				if n >= 0 || name == "rsplit" {
					jfail("%s() without a separator but with maxsplit is not supported", name)
				}
				parts = strings.FieldsFunc(s, unicode.IsSpace)
			} else {
				sp := wantStr(sep, "split separator")
				if sp == "" {
					jfail("empty separator")
				}
				switch {
				case n < 0:
					parts = strings.Split(s, sp)
				case name == "split":
					parts = strings.SplitN(s, sp, n+1)
				default:
					all := strings.Split(s, sp)
					if len(all) > n+1 {
						head := strings.Join(all[:len(all)-n], sp)
						all = append([]string{head}, all[len(all)-n:]...)
					}
					parts = all
				}
			}
			out := make([]jvalue, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out
		})
	case "startswith", "endswith":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) != 1 {
				jfail("%s takes one argument", name)
			}
			var cands []jvalue
			if t, ok := a[0].(jTupleV); ok {
				cands = t
			} else {
				cands = []jvalue{a[0]}
			}
			for _, c := range cands {
				p := wantStr(c, name)
				if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
					return true
				}
			}
			return false
		})
	case "upper":
		return method(func([]jvalue, map[string]jvalue) jvalue { return strings.ToUpper(s) })
	case "lower":
		return method(func([]jvalue, map[string]jvalue) jvalue { return strings.ToLower(s) })
	case "title":
		return method(func([]jvalue, map[string]jvalue) jvalue { return pyTitle(s) })
	case "capitalize":
		return method(func([]jvalue, map[string]jvalue) jvalue { return pyCapitalize(s) })
	case "replace":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) < 2 {
				jfail("replace takes two arguments")
			}
			n := -1
			if len(a) > 2 {
				n = toInt(a[2], "replace count")
			}
			return replaceChecked(s, wantStr(a[0], "replace"), wantStr(a[1], "replace"), n)
		})
	case "find", "count", "index":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) != 1 {
				jfail("%s with start/end is not supported", name)
			}
			sub := wantStr(a[0], name)
			switch name {
			case "count":
				return strings.Count(s, sub)
			}
			i := strings.Index(s, sub)
			if i < 0 {
				if name == "index" {
					jfail("substring not found")
				}
				return -1
			}
			return runeLen(s[:i])
		})
	case "join":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) != 1 {
				jfail("join takes one argument")
			}
			var parts []string
			for _, x := range iterate(a[0]) {
				parts = append(parts, wantStr(x, "join item"))
			}
			return joinChecked(parts, s)
		})
	case "isspace", "isdigit", "isalpha", "isalnum", "isupper", "islower":
		return method(func([]jvalue, map[string]jvalue) jvalue {
			if s == "" {
				return false
			}
			switch name {
			case "isupper":
				return strings.ToUpper(s) == s && strings.ToLower(s) != s
			case "islower":
				return strings.ToLower(s) == s && strings.ToUpper(s) != s
			}
			for _, r := range s {
				ok := false
				switch name {
				case "isspace":
					ok = unicode.IsSpace(r)
				case "isdigit":
					ok = unicode.IsDigit(r)
				case "isalpha":
					ok = unicode.IsLetter(r)
				case "isalnum":
					ok = unicode.IsLetter(r) || unicode.IsNumber(r)
				}
				if !ok {
					return false
				}
			}
			return true
		})
	}
	return nil
}

func dictMethod(d *jDict, name string) jvalue {
	switch name {
	case "items":
		return method(func([]jvalue, map[string]jvalue) jvalue { return dictItems(d) })
	case "keys":
		return method(func([]jvalue, map[string]jvalue) jvalue {
			out := make([]jvalue, len(d.keys))
			for i, k := range d.keys {
				out[i] = k
			}
			return out
		})
	case "values":
		return method(func([]jvalue, map[string]jvalue) jvalue {
			out := make([]jvalue, len(d.keys))
			for i, k := range d.keys {
				out[i] = d.m[k]
			}
			return out
		})
	case "get":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) < 1 || len(a) > 2 {
				jfail("get takes 1 or 2 arguments")
			}
			if k, ok := a[0].(string); ok {
				if v, ok := d.m[k]; ok {
					return v
				}
			}
			if len(a) == 2 {
				return a[1]
			}
			return nil
		})
	}
	return nil
}

func listMethod(l []jvalue, name string) jvalue {
	switch name {
	case "index", "count":
		return method(func(a []jvalue, _ map[string]jvalue) jvalue {
			if len(a) != 1 {
				jfail("%s takes one argument", name)
			}
			n := 0
			for i, x := range l {
				if equal(x, a[0]) {
					if name == "index" {
						return i
					}
					n++
				}
			}
			if name == "index" {
				jfail("value not in list")
			}
			return n
		})
	case "append", "pop", "insert", "extend", "remove", "sort", "reverse", "clear":
		return method(func([]jvalue, map[string]jvalue) jvalue {
			jfail("list.%s is not allowed (templates render in an immutable sandbox)", name)
			return nil
		})
	}
	return nil
}
