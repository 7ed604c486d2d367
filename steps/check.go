package steps

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// WithChecker is implemented by a step kind that can judge its `with` before any run:
// `flowctl workflow validate` and `workflow apply` call it, so that a workflow the kind
// would reject at run time is rejected when it is written, with the file:line:column of
// the offending key. It is optional: a kind without it accepts any `with` until it runs.
//
// with is the step's `with` as written (nil when it has none), not rendered: a string
// holding `{{` is a template whose value is known only at run time, so CheckWith must
// accept it wherever it stands (see [IsTemplate]). CheckWith must not block, do I/O or
// keep with. Return a [*WithError] to point at one key; any other error points at the
// whole `with`.
type WithChecker interface {
	CheckWith(with map[string]any) error
}

// WithError is a bad value in a step's `with`. Path leads from the `with` mapping to
// the value: a key per mapping level, "[i]" for the i-th element of a list, e.g.
// {"command"}, {"command", "[1]"}, {"body", "driver"}.
type WithError struct {
	Path []string
	Msg  string // what is wrong
	Hint string // how to fix it (optional)
}

func (e *WithError) Error() string {
	s := "with"
	for _, p := range e.Path {
		if strings.HasPrefix(p, "[") {
			s += p
		} else {
			s += "." + p
		}
	}
	s += ": " + e.Msg
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// IsTemplate reports whether v is a string holding a template (`{{`): its value, and
// so its type, is known only once rendered.
func IsTemplate(v any) bool {
	s, ok := v.(string)
	return ok && strings.Contains(s, "{{")
}

// WithCheck returns s with check as its [WithChecker]: the way to give a [Func] (or any
// step that cannot have the method) an offline check.
func WithCheck(s Step, check func(with map[string]any) error) Step {
	return checkedStep{Step: s, check: check}
}

type checkedStep struct {
	Step
	check func(map[string]any) error
}

func (c checkedStep) CheckWith(with map[string]any) error { return c.check(with) }

// CheckWith runs kind's [WithChecker] on with. It returns nil for a kind that is not
// registered (that is [Registry.Has]'s to report) or has no checker; a checker's panic
// is returned as an error, since with is user input and validation must not crash the
// node that applies it.
func (r *Registry) CheckWith(kind string, with map[string]any) (err error) {
	s, ok := r.Get(kind)
	if !ok {
		return nil
	}
	c, ok := s.(WithChecker)
	if !ok {
		return nil
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the %s step's check of with panicked: %v", kind, p)
		}
	}()
	return c.CheckWith(with)
}

// CheckWith accepts what Run accepts: command a non-empty list of values (strings,
// numbers or booleans, written as text; templates allowed), env a mapping, dir text.
func (Exec) CheckWith(with map[string]any) error {
	const hint = `argv as a list, e.g. ["./collect.sh", "{{ inputs.date }}"]; use ["sh", "-c", "..."] for a shell`
	cmd, ok := with["command"]
	switch list, isList := cmd.([]any); {
	case !ok:
		return &WithError{Path: []string{"command"}, Msg: "is required", Hint: hint}
	case IsTemplate(cmd):
	case !isList:
		return &WithError{Path: []string{"command"}, Msg: fmt.Sprintf("must be a list, not %s", describe(cmd)), Hint: hint}
	case len(list) == 0:
		return &WithError{Path: []string{"command"}, Msg: "must not be empty", Hint: hint}
	default:
		for i, x := range list {
			switch x.(type) {
			case string, float64, bool:
			default:
				// Run would pass a list or mapping as JSON text: almost always a YAML slip
				// such as `- echo: hi`, so it is refused here.
				return &WithError{Path: []string{"command", "[" + strconv.Itoa(i) + "]"},
					Msg: fmt.Sprintf("must be text, not %s", describe(x)), Hint: "quote it if it is meant as text"}
			}
		}
	}
	if env, ok := with["env"]; ok && !IsTemplate(env) {
		if _, isMap := env.(map[string]any); !isMap {
			return &WithError{Path: []string{"env"}, Msg: fmt.Sprintf("must be a mapping of names to values, not %s", describe(env)), Hint: "e.g. env: {REGION: id}"}
		}
	}
	if dir, ok := with["dir"]; ok {
		if _, isText := dir.(string); !isText {
			return &WithError{Path: []string{"dir"}, Msg: fmt.Sprintf("must be a path, not %s", describe(dir))}
		}
	}
	return nil
}

// httpMethods are the methods http steps are checked against (case does not matter:
// Run upper-cases the method). Anything else is far more often a typo than an
// extension method; a workflow that needs one can write it as a template.
var httpMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodTrace, http.MethodConnect}

// CheckWith accepts what Run accepts: url an absolute http or https URL, method a known
// HTTP method, headers a mapping.
func (HTTP) CheckWith(with map[string]any) error {
	switch u, ok := with["url"]; {
	case !ok:
		return &WithError{Path: []string{"url"}, Msg: "is required", Hint: "e.g. url: https://ledger.internal/credit"}
	case IsTemplate(u):
	default:
		s, _ := u.(string)
		p, err := url.Parse(s)
		if s == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return &WithError{Path: []string{"url"}, Msg: fmt.Sprintf("%s is not an absolute http or https URL", describe(u)),
				Hint: "e.g. url: https://ledger.internal/credit"}
		}
	}
	if m, ok := with["method"]; ok && !IsTemplate(m) {
		s, _ := m.(string)
		known := false
		for _, k := range httpMethods {
			known = known || strings.EqualFold(s, k)
		}
		if !known {
			return &WithError{Path: []string{"method"}, Msg: fmt.Sprintf("%s is not an HTTP method", describe(m)),
				Hint: "use one of " + strings.Join(httpMethods, ", ")}
		}
	}
	if hs, ok := with["headers"]; ok && !IsTemplate(hs) {
		if _, isMap := hs.(map[string]any); !isMap {
			// Run would silently send none of them.
			return &WithError{Path: []string{"headers"}, Msg: fmt.Sprintf("must be a mapping of names to values, not %s", describe(hs)),
				Hint: "e.g. headers: {Authorization: \"Bearer {{ inputs.token }}\"}"}
		}
	}
	return nil
}

// checkSleep accepts what sleep accepts: duration, a non-negative Go duration as text.
func checkSleep(with map[string]any) error {
	const hint = "a Go duration such as 500ms, 30s or 10m"
	if err := checkKeys(with, "duration", "until"); err != nil {
		return err
	}
	d, hasDuration := with["duration"]
	u, hasUntil := with["until"]
	switch {
	case hasDuration && hasUntil:
		return &WithError{Path: []string{"until"}, Msg: "and duration are both given", Hint: "give one: duration (how long) or until (a time)"}
	case hasUntil:
		if IsTemplate(u) {
			return nil
		}
		if s, ok := u.(string); !ok {
			return &WithError{Path: []string{"until"}, Msg: fmt.Sprintf("%s is not a time", describe(u)), Hint: "an RFC 3339 time or a template giving one"}
		} else if _, err := time.Parse(time.RFC3339, s); err != nil {
			return &WithError{Path: []string{"until"}, Msg: fmt.Sprintf("%q is not an RFC 3339 time", s), Hint: "such as 2026-12-03T06:00:00+07:00"}
		}
		return nil
	case !hasDuration:
		return &WithError{Path: []string{"duration"}, Msg: "is required", Hint: hint + "; or until: a time"}
	}
	if IsTemplate(d) {
		return nil
	}
	s, isText := d.(string)
	if !isText {
		return &WithError{Path: []string{"duration"}, Msg: fmt.Sprintf("%s is not a duration", describe(d)), Hint: hint + ", with its unit"}
	}
	if v, err := time.ParseDuration(s); err != nil || v < 0 {
		return &WithError{Path: []string{"duration"}, Msg: fmt.Sprintf("%q is not a duration", s), Hint: hint}
	}
	return nil
}

// describe names a `with` value in an error.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "empty"
	case string:
		return strconv.Quote(x)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return text(v)
}
