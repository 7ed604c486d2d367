package steps

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"
)

// The waiting kinds: `wait` (for a signal) and `approval` (for people's
// decisions) are carried out by the engine, which parks the run instead of holding a
// worker (engine/internal/worker/wait.go); the registry holds them so that workflows
// using them validate, with their `with` checked here. `sleep` with `until`, or longer
// than the engine's park threshold, parks too.

// Kinds the engine carries out itself.
const (
	KindWait     = "wait"
	KindApproval = "approval"
	KindSleep    = "sleep"
	KindWorkflow = "workflow" // a child run of another workflow
	// KindHTTP is the http step, whose idempotency key may cover its request
	// (RequestKey).
	KindHTTP = "http"
)

// ParksItself reports whether the engine carries out a kind instead of running it.
func ParksItself(kind string) bool {
	return kind == KindWait || kind == KindApproval || kind == KindWorkflow
}

// ChildWith is a workflow step's `with`, rendered: the child's workflow and inputs.
type ChildWith struct {
	Workflow string
	Inputs   map[string]any
}

// ParseChildWith reads a workflow step's rendered `with`.
func ParseChildWith(with map[string]any) (ChildWith, error) {
	if err := checkChild(with); err != nil {
		return ChildWith{}, Permanent(err)
	}
	c := ChildWith{Workflow: with["workflow"].(string), Inputs: map[string]any{}}
	if m, ok := with["inputs"].(map[string]any); ok {
		c.Inputs = m
	}
	return c, nil
}

// ChildWorkflow is the workflow a workflow step starts, as written ("" if none).
func ChildWorkflow(with map[string]any) string {
	s, _ := with["workflow"].(string)
	return s
}

func checkChild(with map[string]any) error {
	if err := checkKeys(with, "workflow", "inputs"); err != nil {
		return err
	}
	w, ok := with["workflow"]
	if !ok {
		return &WithError{Path: []string{"workflow"}, Msg: "is required", Hint: "the name of an applied workflow"}
	}
	if name, isText := w.(string); !isText || !signalName.MatchString(name) {
		return &WithError{Path: []string{"workflow"}, Msg: fmt.Sprintf("%s is not a workflow name", describe(w)), Hint: "a workflow's name, written out (not a template: the engine checks for loops at apply)"}
	}
	if in, ok := with["inputs"]; ok && !IsTemplate(in) {
		if _, isMap := in.(map[string]any); !isMap {
			return &WithError{Path: []string{"inputs"}, Msg: fmt.Sprintf("%s is not a mapping", describe(in)), Hint: "{date: \"{{ inputs.date }}\"}"}
		}
	}
	return nil
}

// Roles people may have (client.Roles without the node's), lowest first.
var approverRoles = []string{"viewer", "operator", "admin"}

var signalName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

func engineOnly(ctx context.Context, in Input) (json.RawMessage, error) {
	return nil, Permanentf("step kind of step %s is carried out by the engine, not run", in.Step)
}

// WaitWith is a wait step's `with`, rendered.
type WaitWith struct {
	Signal   string
	Timeout  time.Duration // 0: none
	Continue bool          // on_timeout: continue
}

// ParseWaitWith reads a wait step's rendered `with`.
func ParseWaitWith(with map[string]any) (WaitWith, error) {
	if err := checkWait(with); err != nil {
		return WaitWith{}, Permanent(err)
	}
	w := WaitWith{Signal: with["signal"].(string)}
	if s, ok := with["timeout"].(string); ok && s != "" {
		w.Timeout, _ = time.ParseDuration(s)
	}
	w.Continue = with["on_timeout"] == "continue"
	return w, nil
}

// ApprovalWith is an approval step's `with`, rendered.
type ApprovalWith struct {
	Role          string
	Count         int
	NotTheStarter bool
	Timeout       time.Duration
}

// ParseApprovalWith reads an approval step's rendered `with`.
func ParseApprovalWith(with map[string]any) (ApprovalWith, error) {
	if err := checkApproval(with); err != nil {
		return ApprovalWith{}, Permanent(err)
	}
	a := ApprovalWith{Role: "operator", Count: 1}
	if m, ok := with["approvers"].(map[string]any); ok {
		if r, ok := m["role"].(string); ok {
			a.Role = r
		}
		if n, ok := intValue(m["count"]); ok {
			a.Count = n
		}
		a.NotTheStarter = m["not_the_starter"] == true
	}
	if s, ok := with["timeout"].(string); ok && s != "" {
		a.Timeout, _ = time.ParseDuration(s)
	}
	return a, nil
}

// RoleAtLeast reports whether role is want or above it (viewer < operator < admin).
func RoleAtLeast(role, want string) bool {
	rank := func(r string) int {
		for i, x := range approverRoles {
			if x == r {
				return i
			}
		}
		return -1
	}
	return rank(role) >= 0 && rank(role) >= rank(want)
}

func intValue(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case float64:
		return int(n), float64(int(n)) == n
	case json.Number:
		i, err := n.Int64()
		return int(i), err == nil
	}
	return 0, false
}

func checkKeys(with map[string]any, allowed ...string) error {
	for k := range with {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return &WithError{Path: []string{k}, Msg: "is not a key of this kind", Hint: fmt.Sprintf("use %v", allowed)}
		}
	}
	return nil
}

func checkDuration(with map[string]any, key string) error {
	v, ok := with[key]
	if !ok || IsTemplate(v) {
		return nil
	}
	s, isText := v.(string)
	d, err := time.ParseDuration(s)
	if !isText || err != nil || d <= 0 {
		return &WithError{Path: []string{key}, Msg: fmt.Sprintf("%s is not a positive duration", describe(v)), Hint: "a Go duration such as 30m or 6h"}
	}
	return nil
}

func checkWait(with map[string]any) error {
	if err := checkKeys(with, "signal", "timeout", "on_timeout"); err != nil {
		return err
	}
	s, ok := with["signal"]
	if !ok {
		return &WithError{Path: []string{"signal"}, Msg: "is required", Hint: "the signal's name, e.g. ledger-closed"}
	}
	if name, isText := s.(string); !IsTemplate(s) && (!isText || !signalName.MatchString(name)) {
		return &WithError{Path: []string{"signal"}, Msg: fmt.Sprintf("%s is not a signal name", describe(s)), Hint: "1-64 of a-z, 0-9, '_' or '-'"}
	}
	if err := checkDuration(with, "timeout"); err != nil {
		return err
	}
	if v, ok := with["on_timeout"]; ok && !IsTemplate(v) && v != "fail" && v != "continue" {
		return &WithError{Path: []string{"on_timeout"}, Msg: fmt.Sprintf("%s is not fail or continue", describe(v)), Hint: "fail (the default) or continue"}
	}
	return nil
}

func checkApproval(with map[string]any) error {
	if err := checkKeys(with, "approvers", "timeout"); err != nil {
		return err
	}
	a, ok := with["approvers"]
	if !ok {
		return &WithError{Path: []string{"approvers"}, Msg: "is required", Hint: "{role: operator, count: 2, not_the_starter: true}"}
	}
	m, isMap := a.(map[string]any)
	if !isMap {
		return &WithError{Path: []string{"approvers"}, Msg: fmt.Sprintf("%s is not a mapping", describe(a)), Hint: "{role: operator, count: 2, not_the_starter: true}"}
	}
	for k, v := range m {
		switch k {
		case "role":
			r, _ := v.(string)
			if !RoleAtLeast(r, "viewer") {
				return &WithError{Path: []string{"approvers", "role"}, Msg: fmt.Sprintf("%s is not a person's role", describe(v)), Hint: "viewer, operator or admin"}
			}
		case "count":
			if n, ok := intValue(v); !ok || n < 1 || n > 100 {
				return &WithError{Path: []string{"approvers", "count"}, Msg: fmt.Sprintf("%s is not a count of 1 to 100", describe(v))}
			}
		case "not_the_starter":
			if _, ok := v.(bool); !ok {
				return &WithError{Path: []string{"approvers", "not_the_starter"}, Msg: fmt.Sprintf("%s is not true or false", describe(v))}
			}
		default:
			return &WithError{Path: []string{"approvers", k}, Msg: "is not a key of approvers", Hint: "role, count, not_the_starter"}
		}
	}
	return checkDuration(with, "timeout")
}

// SleepUntil reads a sleep step's rendered `until` (RFC 3339); ok is false when it has
// none.
func SleepUntil(with map[string]any) (t time.Time, ok bool, err error) {
	v, has := with["until"]
	if !has {
		return time.Time{}, false, nil
	}
	s, _ := v.(string)
	t, err = time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, true, Permanentf("sleep: with.until %s is not an RFC 3339 time such as 2026-12-03T06:00:00+07:00", describe(v))
	}
	return t, true, nil
}

// SleepDuration reads a sleep step's rendered `duration`.
func SleepDuration(with map[string]any) (time.Duration, error) {
	s, _ := with["duration"].(string)
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, Permanentf("sleep: with.duration %q is not a duration such as 1s", s)
	}
	return d, nil
}
