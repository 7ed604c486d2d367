package workflow

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Template is a parsed string with `{{ expr }}` parts.
type Template struct {
	src   string
	parts []part
}

type part struct {
	text string // literal text, when expr is nil
	expr *expr
}

// expr is path, helper, not, or a comparison.
type expr struct {
	op    string   // "path", "not", "==", "!="
	path  []string // for "path": segments; numeric segments index lists
	arg   *expr    // for "not", and the left side of a comparison
	lit   any      // right side of a comparison
	text  string   // the expression's source, for errors
	start int      // byte offset of the expression in the template, for errors
}

// Helpers are names usable alone in a template.
var Helpers = map[string]bool{"yesterday": true, "now": true, "today": true}

// ParseTemplate parses s. A string without `{{` is a literal template.
func ParseTemplate(s string) (*Template, error) {
	t := &Template{src: s}
	rest, off := s, 0
	for {
		i := strings.Index(rest, "{{")
		if i < 0 {
			if rest != "" {
				t.parts = append(t.parts, part{text: rest})
			}
			return t, nil
		}
		if i > 0 {
			t.parts = append(t.parts, part{text: rest[:i]})
		}
		j := strings.Index(rest[i:], "}}")
		if j < 0 {
			return nil, fmt.Errorf("template %q: '{{' at offset %d is never closed with '}}'", s, off+i)
		}
		src := strings.TrimSpace(rest[i+2 : i+j])
		e, err := parseExpr(src)
		if err != nil {
			return nil, fmt.Errorf("template %q: %v", s, err)
		}
		e.start = off + i
		t.parts = append(t.parts, part{expr: e})
		rest, off = rest[i+j+2:], off+i+j+2
	}
}

func parseExpr(src string) (*expr, error) {
	if src == "" {
		return nil, fmt.Errorf("empty '{{ }}'")
	}
	if rest, ok := strings.CutPrefix(src, "not "); ok {
		arg, err := parseExpr(strings.TrimSpace(rest))
		if err != nil {
			return nil, err
		}
		return &expr{op: "not", arg: arg, text: src}, nil
	}
	for _, op := range []string{"==", "!="} {
		if l, r, ok := strings.Cut(src, op); ok {
			left, err := parseExpr(strings.TrimSpace(l))
			if err != nil {
				return nil, err
			}
			var lit any
			if err := json.Unmarshal([]byte(strings.TrimSpace(r)), &lit); err != nil {
				return nil, fmt.Errorf("%q: the right side of %s must be a literal (\"text\", 12, true, null)", src, op)
			}
			return &expr{op: op, arg: left, lit: lit, text: src}, nil
		}
	}
	segs := strings.Split(src, ".")
	for _, s := range segs {
		if !validSegment(s) {
			return nil, fmt.Errorf("%q is not a path like inputs.date or steps.collect.output.drivers", src)
		}
	}
	return &expr{op: "path", path: segs, text: src}, nil
}

func validSegment(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c == '-' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}

// Paths returns every path the template reads (helpers included as one segment).
func (t *Template) Paths() [][]string {
	var out [][]string
	var walk func(e *expr)
	walk = func(e *expr) {
		if e.op == "path" {
			out = append(out, e.path)
		} else if e.arg != nil {
			walk(e.arg)
		}
	}
	for _, p := range t.parts {
		if p.expr != nil {
			walk(p.expr)
		}
	}
	return out
}

// Render evaluates the template in scope. A template that is exactly one expression
// returns the value itself (any JSON type); otherwise the parts are joined as text.
func (t *Template) Render(scope map[string]any) (any, error) {
	if len(t.parts) == 1 && t.parts[0].expr != nil {
		return t.parts[0].expr.eval(scope)
	}
	var b strings.Builder
	for _, p := range t.parts {
		if p.expr == nil {
			b.WriteString(p.text)
			continue
		}
		v, err := p.expr.eval(scope)
		if err != nil {
			return nil, err
		}
		b.WriteString(toText(v))
	}
	return b.String(), nil
}

func toText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		return x.String()
	case bool, int, int64:
		return fmt.Sprint(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// MissingKeyError is a template path that does not resolve.
type MissingKeyError struct {
	Expr string
	At   string // the resolved prefix
	Key  string
	Have []string
}

func (e *MissingKeyError) Error() string {
	msg := fmt.Sprintf("{{ %s }}: %s has no %q", e.Expr, e.At, e.Key)
	if len(e.Have) > 0 {
		msg += fmt.Sprintf(" (it has: %s)", strings.Join(e.Have, ", "))
	}
	return msg
}

func (e *expr) eval(scope map[string]any) (any, error) {
	switch e.op {
	case "not":
		v, err := e.arg.eval(scope)
		if err != nil {
			return nil, err
		}
		return !Truthy(v), nil
	case "==", "!=":
		v, err := e.arg.eval(scope)
		if err != nil {
			return nil, err
		}
		eq := equalJSON(v, e.lit)
		return eq == (e.op == "=="), nil
	}
	var cur any = scope
	at := ""
	for _, seg := range e.path {
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[seg]
			if !ok {
				return nil, &MissingKeyError{Expr: e.text, At: orScope(at), Key: seg, Have: keys(c)}
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(c) {
				return nil, &MissingKeyError{Expr: e.text, At: orScope(at), Key: seg, Have: []string{fmt.Sprintf("indexes 0-%d", len(c)-1)}}
			}
			cur = c[i]
		default:
			return nil, &MissingKeyError{Expr: e.text, At: orScope(at), Key: seg}
		}
		if at == "" {
			at = seg
		} else {
			at += "." + seg
		}
	}
	return cur, nil
}

func orScope(at string) string {
	if at == "" {
		return "the template scope"
	}
	return at
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func equalJSON(a, b any) bool {
	ja, _ := json.Marshal(normalizeNumbers(a))
	jb, _ := json.Marshal(normalizeNumbers(b))
	return string(ja) == string(jb)
}

func normalizeNumbers(v any) any {
	switch x := v.(type) {
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case json.Number:
		f, _ := x.Float64()
		return f
	}
	return v
}

// Truthy is the condition rule of `if`: false, null, 0, "", "false", "0", "no", empty
// lists and objects are false; everything else is true.
func Truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		switch strings.ToLower(strings.TrimSpace(x)) {
		case "", "false", "0", "no":
			return false
		}
		return true
	case float64:
		return x != 0
	case int:
		return x != 0
	case int64:
		return x != 0
	case json.Number:
		f, _ := x.Float64()
		return f != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}
