package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
)

// ErrSchema is wrapped by the error of a JSON schema NewJSONSchemaConstraint
// cannot constrain to.
var ErrSchema = errors.New("unsupported JSON schema")

// jsonSchema is a JSON schema compiled for the recognizer: nodes[0] is the
// root, an object.
type jsonSchema struct {
	id    uint64
	nodes []schemaNode
}

// schemaNode is one schema: its type, an object's properties (all
// required, in the schema's order, no others: OpenAI's strict mode), an
// array's items, a string's enum.
type schemaNode struct {
	kind  string
	props []schemaProp
	items uint16
	enum  []string
}

type schemaProp struct {
	key  string
	node uint16
}

var schemaIDs atomic.Uint64

// maxSchemaNodes bounds a schema's size.
const maxSchemaNodes = 1024

// compileSchema reads the subset of JSON Schema the recognizer follows:
// "type" object (with "properties"), array (with "items"), string
// (optionally with "enum" of strings), number, integer, boolean, null.
// Every property is written, in the order the schema lists them.
func compileSchema(raw []byte) (*jsonSchema, error) {
	s := &jsonSchema{id: schemaIDs.Add(1)}
	root, err := s.add(raw, "schema")
	if err != nil {
		return nil, err
	}
	if s.nodes[root].kind != "object" {
		return nil, fmt.Errorf("%w: the root is a %q, want an object", ErrSchema, s.nodes[root].kind)
	}
	return s, nil
}

func (s *jsonSchema) add(raw []byte, path string) (uint16, error) {
	if len(s.nodes) == maxSchemaNodes {
		return 0, fmt.Errorf("%w: more than %d nodes", ErrSchema, maxSchemaNodes)
	}
	var d struct {
		Type       string          `json:"type"`
		Properties json.RawMessage `json:"properties"`
		Items      json.RawMessage `json:"items"`
		Enum       []any           `json:"enum"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrSchema, path, err)
	}
	i := uint16(len(s.nodes))
	s.nodes = append(s.nodes, schemaNode{kind: d.Type})
	switch d.Type {
	case "object":
		keys, err := orderedKeys(d.Properties)
		if err != nil {
			return 0, fmt.Errorf("%w: %s.properties: %v", ErrSchema, path, err)
		}
		var props map[string]json.RawMessage
		json.Unmarshal(d.Properties, &props)
		for _, k := range keys {
			if strings.ContainsAny(k, "\"\\") || strings.ContainsFunc(k, func(r rune) bool { return r < 0x20 }) {
				return 0, fmt.Errorf("%w: %s: property %q needs escapes", ErrSchema, path, k)
			}
			n, err := s.add(props[k], path+".properties."+k)
			if err != nil {
				return 0, err
			}
			s.nodes[i].props = append(s.nodes[i].props, schemaProp{key: k, node: n})
		}
	case "array":
		if d.Items == nil {
			return 0, fmt.Errorf("%w: %s: an array needs items", ErrSchema, path)
		}
		n, err := s.add(d.Items, path+".items")
		if err != nil {
			return 0, err
		}
		s.nodes[i].items = n
	case "string":
		if len(d.Enum) > 64 {
			return 0, fmt.Errorf("%w: %s: more than 64 enum options", ErrSchema, path)
		}
		for _, e := range d.Enum {
			o, ok := e.(string)
			if !ok || strings.ContainsAny(o, "\"\\") || strings.ContainsFunc(o, func(r rune) bool { return r < 0x20 }) {
				return 0, fmt.Errorf("%w: %s: enum option %v is not a plain string", ErrSchema, path, e)
			}
			s.nodes[i].enum = append(s.nodes[i].enum, o)
		}
	case "number", "integer", "boolean", "null":
	default:
		return 0, fmt.Errorf("%w: %s: type %q (want object, array, string, number, integer, boolean or null)", ErrSchema, path, d.Type)
	}
	return i, nil
}

// orderedKeys returns the keys of a JSON object in their order.
func orderedKeys(raw []byte) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not an object")
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, t.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// child is the node of the value that starts at depth, inside frames.
func (s *jsonSchema) child(depth uint8, frames []schemaFrame) uint16 {
	if depth == 0 {
		return 0
	}
	f := frames[depth-1]
	n := &s.nodes[f.node]
	if n.kind == "array" {
		return n.items
	}
	return n.props[f.idx].node
}

// starts reports whether a value of n may begin with c.
func (n *schemaNode) starts(c byte) bool {
	switch n.kind {
	case "object":
		return c == '{'
	case "array":
		return c == '['
	case "string":
		return c == '"'
	case "number", "integer":
		return c == '-' || c >= '0' && c <= '9'
	case "boolean":
		return c == 't' || c == 'f'
	case "null":
		return c == 'n'
	}
	return false
}

// NewJSONSchemaConstraint is NewJSONConstraint for an object that follows
// schema (OpenAI's response_format json_schema, strict): the subset
// compileSchema reads; other schemas fail with an error wrapping ErrSchema.
func (m *Model) NewJSONSchemaConstraint(schema []byte, stops []int) (Constraint, error) {
	c, err := m.NewJSONConstraint(stops)
	if err != nil {
		return nil, err
	}
	jc := c.(*jsonConstraint)
	if jc.st.sch, err = jc.masks.schema(schema); err != nil {
		return nil, err
	}
	return jc, nil
}
