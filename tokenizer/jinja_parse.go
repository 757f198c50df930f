package tokenizer

import (
	"fmt"
	"strconv"
)

// ---- AST ----

type jnode interface{}

type (
	jTextNode struct{ text string }
	jOutput   struct{ e jexpr }
	jIf       struct {
		conds  []jexpr
		bodies [][]jnode
		els    []jnode
	}
	jFor struct {
		vars  []string
		iter  jexpr
		cond  jexpr // optional "if" filter
		body  []jnode
		els   []jnode
		pos   int
		recur bool
	}
	jSet struct {
		target string
		attr   string // ns.attr assignment when set
		value  jexpr
		body   []jnode // block set
	}
	jBreak     struct{}
	jContinue  struct{}
	jMacroNode struct {
		name     string
		params   []string
		defaults []jexpr
		body     []jnode
	}
)

type jexpr interface{}

type (
	jLit struct{ v jvalue }
	jVar struct {
		name string
		pos  int
	}
	jAttr struct {
		obj  jexpr
		name string
		pos  int
	}
	jIndex struct {
		obj, idx jexpr
		pos      int
	}
	jSlice   struct{ obj, lo, hi, step jexpr }
	jListLit struct{ items []jexpr }
	jTuple   struct{ items []jexpr }
	jDictLit struct{ keys, vals []jexpr }
	jCall    struct {
		fn     jexpr
		args   []jexpr
		kwargs []jkwarg
		pos    int
	}
	jFilter struct {
		arg    jexpr
		name   string
		args   []jexpr
		kwargs []jkwarg
		pos    int
	}
	jTest struct {
		arg  jexpr
		name string
		args []jexpr
		neg  bool
		pos  int
	}
	jBinary struct {
		op   string
		l, r jexpr
		pos  int
	}
	jUnary struct {
		op string
		x  jexpr
	}
	jCond struct{ cond, yes, no jexpr }
)

type jkwarg struct {
	name string
	v    jexpr
}

// ---- Parser ----

type jparser struct {
	toks  []jtok
	i     int
	depth int // nested parse calls under way
}

// maxNesting bounds how deep tags and expressions nest (parsing) and how deep
// evaluation recurses: far past any real template, and well inside the
// goroutine stack a deeper one would overflow (which no recover catches).
const maxNesting = 2000

// enter counts a nested parse call; leave undoes it.
func (p *jparser) enter() {
	if p.depth++; p.depth > maxNesting {
		p.fail("nested more than %d deep", maxNesting)
	}
}
func (p *jparser) leave() { p.depth-- }

type jSyntaxError struct {
	pos int
	msg string
}

func (e *jSyntaxError) Error() string {
	return fmt.Sprintf("chat template: offset %d: %s", e.pos, e.msg)
}

func (p *jparser) peek() jtok { return p.toks[p.i] }
func (p *jparser) next() jtok { t := p.toks[p.i]; p.i++; return t }

func (p *jparser) fail(format string, a ...any) {
	panic(&jSyntaxError{pos: p.peek().pos, msg: fmt.Sprintf(format, a...)})
}

func (p *jparser) isOp(v string) bool {
	t := p.peek()
	return t.kind == jOp && t.val == v
}

func (p *jparser) isName(v string) bool {
	t := p.peek()
	return t.kind == jName && t.val == v
}

func (p *jparser) expectOp(v string) {
	if !p.isOp(v) {
		p.fail("expected %q, found %q", v, p.peek().val)
	}
	p.i++
}

func (p *jparser) expectName() string {
	t := p.peek()
	if t.kind != jName {
		p.fail("expected a name")
	}
	p.i++
	return t.val
}

func (p *jparser) expectKind(k jtokKind, what string) {
	if p.peek().kind != k {
		p.fail("expected %s", what)
	}
	p.i++
}

// parseTemplate parses tokens into a node list.
func parseTemplate(toks []jtok) (nodes []jnode, err error) {
	defer func() {
		if r := recover(); r != nil {
			se, ok := r.(*jSyntaxError)
			if !ok {
				panic(r)
			}
			err = se
		}
	}()
	p := &jparser{toks: toks}
	nodes, end := p.parseBody()
	if end != "" {
		p.fail("unexpected {%% %s %%}", end)
	}
	return nodes, nil
}

// parseBody parses nodes until EOF or a block tag in stop words; it returns
// the stop word found (the tag name), leaving the parser after the name.
func (p *jparser) parseBody(stop ...string) ([]jnode, string) {
	var out []jnode
	for {
		t := p.peek()
		switch t.kind {
		case jEOF:
			if len(stop) > 0 {
				p.fail("missing {%% %s %%}", stop[len(stop)-1])
			}
			return out, ""
		case jText:
			p.i++
			out = append(out, jTextNode{t.val})
		case jVarBegin:
			p.i++
			e := p.parseExpr()
			p.expectKind(jVarEnd, "}}")
			out = append(out, jOutput{e})
		case jBlockBegin:
			p.i++
			nt := p.peek()
			if nt.kind != jName {
				p.fail("expected a tag name")
			}
			for _, s := range stop {
				if nt.val == s {
					p.i++
					return out, s
				}
			}
			p.i++
			out = append(out, p.parseTag(nt))
		default:
			p.fail("unexpected token %q", t.val)
		}
	}
}

func (p *jparser) endTag() { p.expectKind(jBlockEnd, "%}") }

func (p *jparser) parseTag(t jtok) jnode {
	p.enter()
	defer p.leave()
	switch t.val {
	case "if":
		n := jIf{}
		cond := p.parseExpr()
		p.endTag()
		for {
			body, end := p.parseBody("elif", "else", "endif")
			n.conds = append(n.conds, cond)
			n.bodies = append(n.bodies, body)
			switch end {
			case "elif":
				cond = p.parseExpr()
				p.endTag()
				continue
			case "else":
				p.endTag()
				n.els, _ = p.parseBody("endif")
			}
			p.endTag()
			return n
		}
	case "for":
		n := jFor{pos: t.pos}
		n.vars = append(n.vars, p.expectName())
		for p.isOp(",") {
			p.i++
			n.vars = append(n.vars, p.expectName())
		}
		if !p.isName("in") {
			p.fail("expected 'in' in for")
		}
		p.i++
		n.iter = p.parseCondless()
		if p.isName("if") {
			p.i++
			n.cond = p.parseCondless()
		}
		if p.isName("recursive") {
			p.fail("recursive loops are not supported")
		}
		p.endTag()
		body, end := p.parseBody("else", "endfor")
		n.body = body
		if end == "else" {
			p.endTag()
			n.els, _ = p.parseBody("endfor")
		}
		p.endTag()
		return n
	case "set":
		n := jSet{target: p.expectName()}
		if p.isOp(".") {
			p.i++
			n.attr = p.expectName()
		}
		if p.isOp(",") {
			p.fail("tuple assignment in set is not supported")
		}
		if p.isOp("=") {
			p.i++
			n.value = p.parseExpr()
			p.endTag()
			return n
		}
		if n.attr != "" {
			p.fail("block set of an attribute is not supported")
		}
		p.endTag()
		n.body, _ = p.parseBody("endset")
		p.endTag()
		return n
	case "break":
		p.endTag()
		return jBreak{}
	case "continue":
		p.endTag()
		return jContinue{}
	case "generation":
		// transformers' AssistantTracker: renders its body unchanged.
		p.endTag()
		body, _ := p.parseBody("endgeneration")
		p.endTag()
		return jIf{conds: []jexpr{jLit{true}}, bodies: [][]jnode{body}}
	case "macro":
		n := jMacroNode{name: p.expectName()}
		p.expectOp("(")
		for !p.isOp(")") {
			n.params = append(n.params, p.expectName())
			var def jexpr
			if p.isOp("=") {
				p.i++
				def = p.parseExpr()
			}
			n.defaults = append(n.defaults, def)
			if !p.isOp(",") {
				break
			}
			p.i++
		}
		p.expectOp(")")
		p.endTag()
		n.body, _ = p.parseBody("endmacro")
		p.endTag()
		return n
	}
	p.i--
	p.fail("unsupported tag %q", t.val)
	return nil
}

// parseExpr parses a full expression, including "a if c else b".
func (p *jparser) parseExpr() jexpr {
	p.enter()
	defer p.leave()
	e := p.parseOr()
	for p.isName("if") {
		p.i++
		cond := p.parseOr()
		var no jexpr = jLit{jUndefined{name: "else branch"}}
		if p.isName("else") {
			p.i++
			no = p.parseExpr()
		}
		e = jCond{cond, e, no}
	}
	return e
}

// parseCondless parses an expression without a trailing conditional (for
// "for x in y if cond").
func (p *jparser) parseCondless() jexpr { return p.parseOr() }

// parseLeft parses a left-associative chain operand (op operand)*, where
// at reports whether the next token is one of the level's operators.
func (p *jparser) parseLeft(operand func() jexpr, at func() bool) jexpr {
	e := operand()
	for at() {
		t := p.next()
		e = jBinary{t.val, e, operand(), t.pos}
	}
	return e
}

// atOp reports whether the next token is one of the operators ops.
func (p *jparser) atOp(ops ...string) bool {
	for _, op := range ops {
		if p.isOp(op) {
			return true
		}
	}
	return false
}

func (p *jparser) parseOr() jexpr {
	return p.parseLeft(p.parseAnd, func() bool { return p.isName("or") })
}

func (p *jparser) parseAnd() jexpr {
	return p.parseLeft(p.parseNot, func() bool { return p.isName("and") })
}

func (p *jparser) parseNot() jexpr {
	p.enter()
	defer p.leave()
	if p.isName("not") {
		p.i++
		return jUnary{"not", p.parseNot()}
	}
	return p.parseCompare()
}

func (p *jparser) parseCompare() jexpr {
	e := p.parseMath1()
	var chain jexpr
	for {
		t := p.peek()
		var op string
		switch {
		case t.kind == jOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == "<=" || t.val == ">" || t.val == ">="):
			op = t.val
			p.i++
		case t.kind == jName && t.val == "in":
			op = "in"
			p.i++
		case t.kind == jName && t.val == "not" && p.toks[p.i+1].kind == jName && p.toks[p.i+1].val == "in":
			op = "not in"
			p.i += 2
		default:
			if chain != nil {
				return chain
			}
			return e
		}
		r := p.parseMath1()
		cmp := jBinary{op, e, r, t.pos}
		if chain == nil {
			chain = cmp
		} else {
			chain = jBinary{"and", chain, cmp, t.pos}
		}
		e = r
	}
}

func (p *jparser) parseMath1() jexpr {
	return p.parseLeft(p.parseConcat, func() bool { return p.atOp("+", "-") })
}

func (p *jparser) parseConcat() jexpr {
	return p.parseLeft(p.parseMath2, func() bool { return p.atOp("~") })
}

func (p *jparser) parseMath2() jexpr {
	return p.parseLeft(p.parsePow, func() bool { return p.atOp("*", "/", "//", "%") })
}

func (p *jparser) parsePow() jexpr {
	return p.parseLeft(func() jexpr { return p.parseUnary(true) }, func() bool { return p.atOp("**") })
}

// parseUnary parses unary +/- and a primary with its postfixes; as in
// Jinja2, filters apply to the whole unary expression ("-x|abs" is
// "(-x)|abs").
func (p *jparser) parseUnary(withFilters bool) jexpr {
	p.enter()
	defer p.leave()
	var e jexpr
	if p.isOp("-") || p.isOp("+") {
		t := p.next()
		e = jUnary{t.val, p.parseUnary(false)}
	} else {
		e = p.parsePostfix(p.parsePrimary())
	}
	if withFilters {
		e = p.parseFilters(e)
	}
	return e
}

func (p *jparser) parseFilters(e jexpr) jexpr {
	for {
		switch {
		case p.isOp("|"):
			p.i++
			t := p.peek()
			name := p.expectName()
			if _, ok := jFilters[name]; !ok {
				p.i--
				p.fail("unsupported filter %q", name)
			}
			f := jFilter{arg: e, name: name, pos: t.pos}
			if p.isOp("(") {
				f.args, f.kwargs = p.parseArgs()
			}
			e = p.parsePostfix(f)
		case p.isName("is"):
			p.i++
			neg := false
			if p.isName("not") {
				p.i++
				neg = true
			}
			t := p.peek()
			var name string
			switch {
			case t.kind == jName:
				name = t.val
			case t.kind == jOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
				name = t.val
			default:
				p.fail("expected a test name after 'is'")
			}
			if _, ok := jTests[name]; !ok {
				p.fail("unsupported test %q", name)
			}
			p.i++
			ts := jTest{arg: e, name: name, neg: neg, pos: t.pos}
			if p.isOp("(") {
				var kw []jkwarg
				ts.args, kw = p.parseArgs()
				if len(kw) > 0 {
					p.fail("keyword arguments to tests are not supported")
				}
			} else if nt := p.peek(); nt.kind == jString || nt.kind == jInt || nt.kind == jFloat ||
				nt.kind == jName && nt.val != "and" && nt.val != "or" && nt.val != "else" && nt.val != "if" && nt.val != "is" && nt.val != "in" && nt.val != "not" {
				ts.args = []jexpr{p.parsePostfix(p.parsePrimary())}
			}
			e = ts
		default:
			return e
		}
	}
}

func (p *jparser) parseArgs() ([]jexpr, []jkwarg) {
	p.expectOp("(")
	var args []jexpr
	var kwargs []jkwarg
	for !p.isOp(")") {
		if p.peek().kind == jName && p.toks[p.i+1].kind == jOp && p.toks[p.i+1].val == "=" {
			name := p.next().val
			p.i++
			kwargs = append(kwargs, jkwarg{name, p.parseExpr()})
		} else {
			if len(kwargs) > 0 {
				p.fail("positional argument after keyword argument")
			}
			if p.isOp("*") || p.isOp("**") {
				p.fail("argument unpacking is not supported")
			}
			args = append(args, p.parseExpr())
		}
		if !p.isOp(",") {
			break
		}
		p.i++
	}
	p.expectOp(")")
	return args, kwargs
}

func (p *jparser) parsePostfix(e jexpr) jexpr {
	for {
		t := p.peek()
		switch {
		case p.isOp("."):
			p.i++
			nt := p.peek()
			if nt.kind == jInt {
				p.i++
				n, _ := strconv.Atoi(nt.val)
				e = jIndex{e, jLit{n}, nt.pos}
				continue
			}
			e = jAttr{e, p.expectName(), t.pos}
		case p.isOp("["):
			p.i++
			var parts [3]jexpr
			k := 0
			isSlice := false
			for {
				if p.isOp(":") {
					isSlice = true
					k++
					if k > 2 {
						p.fail("too many ':' in slice")
					}
					p.i++
					continue
				}
				if p.isOp("]") {
					break
				}
				parts[k] = p.parseExpr()
				if !p.isOp(":") && !p.isOp("]") {
					p.fail("expected ']'")
				}
			}
			p.expectOp("]")
			if isSlice {
				e = jSlice{e, parts[0], parts[1], parts[2]}
			} else {
				if parts[0] == nil {
					p.fail("empty subscript")
				}
				e = jIndex{e, parts[0], t.pos}
			}
		case p.isOp("("):
			args, kwargs := p.parseArgs()
			e = jCall{e, args, kwargs, t.pos}
		default:
			return e
		}
	}
}

func (p *jparser) parsePrimary() jexpr {
	t := p.next()
	switch t.kind {
	case jString:
		s := t.val
		// Adjacent string literals concatenate.
		for p.peek().kind == jString {
			s += p.next().val
		}
		return jLit{s}
	case jInt:
		n, err := strconv.Atoi(t.val)
		if err != nil {
			p.i--
			p.fail("bad integer %q", t.val)
		}
		return jLit{n}
	case jFloat:
		f, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			p.i--
			p.fail("bad number %q", t.val)
		}
		return jLit{f}
	case jName:
		switch t.val {
		case "true", "True":
			return jLit{true}
		case "false", "False":
			return jLit{false}
		case "none", "None":
			return jLit{nil}
		}
		return jVar{t.val, t.pos}
	case jOp:
		switch t.val {
		case "(":
			if p.isOp(")") {
				p.i++
				return jTuple{}
			}
			e := p.parseExpr()
			if p.isOp(",") {
				items := []jexpr{e}
				for p.isOp(",") {
					p.i++
					if p.isOp(")") {
						break
					}
					items = append(items, p.parseExpr())
				}
				p.expectOp(")")
				return jTuple{items}
			}
			p.expectOp(")")
			return e
		case "[":
			var items []jexpr
			for !p.isOp("]") {
				items = append(items, p.parseExpr())
				if !p.isOp(",") {
					break
				}
				p.i++
			}
			p.expectOp("]")
			return jListLit{items}
		case "{":
			var d jDictLit
			for !p.isOp("}") {
				d.keys = append(d.keys, p.parseExpr())
				p.expectOp(":")
				d.vals = append(d.vals, p.parseExpr())
				if !p.isOp(",") {
					break
				}
				p.i++
			}
			p.expectOp("}")
			return d
		}
	}
	p.i--
	p.fail("unexpected %q", t.val)
	return nil
}
