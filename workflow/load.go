package workflow

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is one problem in a workflow file.
type Error struct {
	File      string
	Line, Col int
	Msg, Hint string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

// Errors are all the problems found in one file.
type Errors []*Error

func (es Errors) Error() string {
	var b []string
	for _, e := range es {
		b = append(b, e.Error())
	}
	return strings.Join(b, "\n")
}

type loader struct {
	file     string
	errs     Errors
	maxSteps int // MaxSteps; tests lift it to measure validation beyond the cap
	// stepsBroken: a list of steps (the workflow's or a handler's) could not be read as
	// a graph (a step without a sound name, needs or with), so the passes over the whole
	// graph (validate) would judge steps that are not there. Any other error (a deadline,
	// a timeout, a schedule, an input) leaves them to run: a file's errors are reported
	// together, not one pass at a time.
	stepsBroken bool
	ops         int          // work done by validate's graph passes, for the test of linear time
	onNodes     []*yaml.Node // each of the workflow's triggers' mapping, for checkTriggers' errors
}

func (l *loader) errAt(line, col int, msg, hint string) *Error {
	return &Error{File: l.file, Line: line, Col: col, Msg: msg, Hint: hint}
}

func (l *loader) fail(n *yaml.Node, hint, format string, args ...any) {
	l.errs = append(l.errs, l.errAt(n.Line, n.Column, fmt.Sprintf(format, args...), hint))
}

var yamlLineRe = regexp.MustCompile(`line (\d+)(?::(\d+))?`)

func (l *loader) yamlError(err error) error {
	line, col := 1, 1
	if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
		fmt.Sscan(m[1], &line)
		if m[2] != "" {
			fmt.Sscan(m[2], &col)
		}
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	msg = yamlLineRe.ReplaceAllString(msg, "")
	msg = strings.Trim(strings.TrimSpace(msg), ":")
	return Errors{l.errAt(line, col, "not valid YAML: "+strings.TrimSpace(msg), "check indentation and quoting")}
}

// mapping calls fn for each key of a mapping node, rejecting unknown and repeated keys.
func (l *loader) mapping(n *yaml.Node, what string, known []string, fn func(key string, k, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		l.fail(n, "", "%s must be a mapping of keys to values, not %s", what, kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if seen[k.Value] {
			l.fail(k, "remove one of them", "%s has %q twice", what, k.Value)
			continue
		}
		seen[k.Value] = true
		if !slices.Contains(known, k.Value) {
			l.fail(k, "known keys: "+strings.Join(known, ", ")+suggest(k.Value, known), "unknown key %q in %s", k.Value, what)
			continue
		}
		fn(k.Value, k, v)
	}
}

func suggest(got string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, got) || strings.ReplaceAll(k, "_", "") == strings.ReplaceAll(strings.ToLower(got), "-", "") ||
			(len(got) > 3 && (strings.HasPrefix(k, got[:3]) && abs(len(k)-len(got)) <= 2)) {
			return "; did you mean " + k + "?"
		}
	}
	return ""
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "empty"
		}
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "something else"
}

func (l *loader) str(n *yaml.Node, what string) string {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		l.fail(n, "", "%s must be text, not %s", what, kindName(n))
		return ""
	}
	return n.Value
}

func (l *loader) integer(n *yaml.Node, what string, lo, hi int) int {
	var v int
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
		l.fail(n, fmt.Sprintf("a whole number from %d to %d", lo, hi), "%s must be a whole number, not %s", what, kindName(n))
		return 0
	}
	if v < lo || v > hi {
		l.fail(n, fmt.Sprintf("a whole number from %d to %d", lo, hi), "%s %d is out of range", what, v)
	}
	return v
}

func (l *loader) duration(n *yaml.Node, what string) Duration {
	s := l.str(n, what)
	if s == "" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		l.fail(n, "a positive Go duration such as 30s, 10m or 2h", "%s %q is not a duration", what, s)
		return 0
	}
	return Duration(d)
}

func (l *loader) workflow(n *yaml.Node, w *Workflow) {
	var nameNode, stepsNode *yaml.Node
	l.mapping(n, "the workflow", []string{"name", "description", "max_epochs", "timeout", "concurrency", "deadline", "inputs", "outputs", "schedule", "steps", "on_failure", "on_dead_letter", "on_deadline", "on", "runs_on", "priority"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			nameNode = v
			w.Name = l.str(v, "name")
			if w.Name != "" && !validName(w.Name) {
				l.fail(v, "use 1-64 of a-z, 0-9, '-' and '_', starting with a letter or digit", "workflow name %q is not allowed", w.Name)
			}
		case "description":
			w.Description = l.str(v, "description")
		case "max_epochs":
			w.MaxEpochs = l.integer(v, "max_epochs", 1, 1000)
		case "timeout":
			w.Timeout = l.duration(v, "timeout")
		case "concurrency":
			l.concurrency(v, w)
		case "deadline":
			w.Deadline = l.str(v, "deadline")
			if _, err := parseDeadline(w.Deadline); err != nil {
				l.fail(v, `a time of day such as "06:00" (after the tick, in the schedule's timezone) or a duration such as 4h`, "deadline %q: %v", w.Deadline, err)
			}
		case "inputs":
			l.inputs(v, w)
		case "outputs":
			l.outputs(v, w)
		case "schedule":
			w.Schedule = l.schedule(v)
		case "on":
			l.triggers(v, w)
		case "runs_on":
			w.RunsOn = l.runsOn(v, "the workflow's")
		case "priority":
			w.Priority = l.integer(v, "priority", -100, 100)
		case "steps":
			stepsNode = v
			l.steps(k, v, w)
		case "on_failure", "on_dead_letter", "on_deadline":
			hw := &Workflow{}
			l.steps(k, v, hw)
			if w.Handlers == nil {
				w.Handlers = map[string][]*Step{}
			}
			w.Handlers[key] = hw.Steps
		}
	})
	if n.Kind == yaml.MappingNode {
		if nameNode == nil {
			l.fail(n, "add `name: my-workflow`", "the workflow has no name")
		}
		if stepsNode == nil {
			l.fail(n, "add `steps:` with at least one step", "the workflow has no steps")
		}
	}
}

// outputs reads `outputs:`, a mapping of names to templates (validate checks what they
// read).
func (l *loader) outputs(n *yaml.Node, w *Workflow) {
	if n.Kind != yaml.MappingNode {
		l.fail(n, "e.g. `outputs: {paid: \"{{ steps.transfer.output.count }}\"}`", "outputs must be a mapping of names to templates")
		return
	}
	w.Outputs = map[string]string{}
	w.outputsAt = map[string][2]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !validName(k.Value) {
			l.fail(k, "use 1-64 of a-z, 0-9, '-' and '_'", "output name %q is not allowed", k.Value)
			continue
		}
		w.Outputs[k.Value] = l.str(v, "output "+k.Value)
		w.outputsAt[k.Value] = [2]int{v.Line, v.Column}
	}
}

func (l *loader) inputs(n *yaml.Node, w *Workflow) {
	if n.Kind != yaml.MappingNode {
		l.fail(n, "e.g. `inputs: {date: {type: string}}`", "inputs must be a mapping of names to {type, default}")
		return
	}
	seen := map[string]bool{} // not a scan of w.Inputs: that is quadratic in a large file
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		in := Input{Name: k.Value, Type: "string"}
		if !validName(in.Name) {
			l.fail(k, "use a-z, 0-9, '-' and '_'", "input name %q is not allowed", in.Name)
		}
		if seen[in.Name] {
			l.fail(k, "remove one of them", "input %q is declared twice", in.Name)
		}
		seen[in.Name] = true
		var typeNode, defNode *yaml.Node
		l.mapping(v, "input "+in.Name, []string{"type", "default", "description", "secret"}, func(key string, _, v *yaml.Node) {
			switch key {
			case "type":
				typeNode = v
				in.Type = l.str(v, "type")
				if !slices.Contains(inputTypes, in.Type) {
					l.fail(v, "use one of: "+strings.Join(inputTypes, ", "), "input %s has unknown type %q", in.Name, in.Type)
				}
			case "default":
				defNode = v
			case "description":
				in.Description = l.str(v, "description")
			case "secret":
				if err := v.Decode(&in.Secret); err != nil || v.Kind != yaml.ScalarNode {
					l.fail(v, "use `secret: true` or `secret: false`", "input %s: secret must be true or false", in.Name)
				}
			}
		})
		_ = typeNode
		if defNode != nil {
			var def any
			if err := defNode.Decode(&def); err != nil {
				l.fail(defNode, "", "input %s: default: %v", in.Name, err)
			} else {
				in.Default, in.HasDefault = normalize(def), true
				if s, ok := def.(string); !ok || !strings.Contains(s, "{{") {
					if err := CheckType(in.Type, in.Default); err != nil {
						l.fail(defNode, "make the default match the type", "input %s: default: %v", in.Name, err)
					}
				} else if _, err := ParseTemplate(s); err != nil {
					l.fail(defNode, "", "input %s: default: %v", in.Name, err)
				}
			}
		}
		w.Inputs = append(w.Inputs, in)
	}
}

func (l *loader) schedule(n *yaml.Node) *Schedule {
	s := &Schedule{Timezone: "UTC", Overlap: "skip", Catchup: "none"}
	var cronNode *yaml.Node
	l.mapping(n, "schedule", []string{"cron", "timezone", "overlap", "catchup"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "cron":
			cronNode = v
			s.Cron = l.str(v, "cron")
		case "timezone":
			s.Timezone = l.str(v, "timezone")
			if _, err := time.LoadLocation(s.Timezone); err != nil || s.Timezone == "" || strings.EqualFold(s.Timezone, "local") {
				l.fail(v, "use an IANA name such as UTC, Asia/Jakarta or America/New_York", "unknown timezone %q", s.Timezone)
			}
		case "overlap":
			s.Overlap = l.str(v, "overlap")
			if !slices.Contains([]string{"skip", "queue", "allow"}, s.Overlap) {
				l.fail(v, "use skip, queue or allow", "unknown overlap policy %q", s.Overlap)
			}
		case "catchup":
			s.Catchup = l.str(v, "catchup")
			if !slices.Contains([]string{"none", "latest", "all"}, s.Catchup) {
				l.fail(v, "use none, latest or all", "unknown catch-up policy %q", s.Catchup)
			}
		}
	})
	if n.Kind == yaml.MappingNode && cronNode == nil {
		l.fail(n, "add e.g. `cron: \"0 2 * * *\"`", "a schedule needs a cron expression")
	}
	if cronNode != nil && s.Cron != "" {
		if err := CheckCron(s.Cron); err != nil {
			l.fail(cronNode, "5 fields (minute hour day month weekday), 6 with seconds first, or @daily/@hourly/@every 1h", "bad cron %q: %v", s.Cron, err)
		}
	}
	return s
}

// CheckCron parses a cron spec (guarding the parser's panics on some inputs).
func CheckCron(spec string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unparseable: %v", r)
		}
	}()
	if strings.HasPrefix(spec, "CRON_TZ=") || strings.HasPrefix(spec, "TZ=") {
		return fmt.Errorf("put the zone in `timezone:`, not in the spec")
	}
	sched, err := CronParser.Parse(spec)
	if err != nil {
		return err
	}
	if sched.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return fmt.Errorf("it never fires")
	}
	return nil
}

func (l *loader) steps(key, n *yaml.Node, w *Workflow) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		l.fail(n, "each step starts with `- name: ...`", "steps must be a non-empty list")
		l.stepsBroken = true
		return
	}
	if len(n.Content) > l.maxSteps {
		// Refused before any step is read: the point of the cap is that an oversized
		// file costs no more than its parse.
		l.fail(key, "split it into workflows, or make many items of the same work one step with foreach",
			"the workflow has %d steps; at most %d are allowed", len(n.Content), l.maxSteps)
		l.stepsBroken = true
		return
	}
	w.byName = map[string]*Step{}
	for _, sn := range n.Content {
		st := &Step{Line: sn.Line, Parallelism: DefaultParallelism,
			Retry: Retry{MaxAttempts: DefaultMaxAttempts, InitialInterval: Duration(time.Second), MaxInterval: Duration(time.Minute), Multiplier: 2}}
		var nameNode *yaml.Node
		var graphKeys bool // an error in name, needs or with (the rest do not break the graph)
		l.mapping(sn, "a step", []string{"name", "uses", "with", "needs", "foreach", "parallelism", "retry", "timeout", "if", "concurrency", "runs_on", "rate_limit"}, func(key string, _, v *yaml.Node) {
			before := len(l.errs)
			defer func() {
				if len(l.errs) > before && (key == "name" || key == "needs" || key == "with") {
					graphKeys = true
				}
			}()
			switch key {
			case "name":
				nameNode = v
				st.Name = l.str(v, "step name")
			case "uses":
				st.Uses = l.str(v, "uses")
				st.usesNode = v
			case "with":
				var with map[string]any
				if v.Kind != yaml.MappingNode {
					l.fail(v, "e.g. `with: {duration: 1s}`", "with must be a mapping")
				} else if err := v.Decode(&with); err != nil {
					l.fail(v, "", "with: %v", err)
				} else {
					st.With = normalize(with).(map[string]any)
					st.withNode = v
					collectTemplates(v, "with", &st.templates)
				}
			case "needs":
				if v.Kind == yaml.ScalarNode && v.Tag != "!!null" {
					st.Needs = []string{v.Value}
					st.needsNodes = []*yaml.Node{v}
				} else if v.Kind != yaml.SequenceNode {
					l.fail(v, "e.g. `needs: [collect]`", "needs must be a list of step names")
				} else {
					for _, x := range v.Content {
						st.Needs = append(st.Needs, l.str(x, "needs"))
						st.needsNodes = append(st.needsNodes, x)
					}
				}
			case "foreach":
				st.Foreach = l.str(v, "foreach")
				st.templates = append(st.templates, tmplAt{"foreach", st.Foreach, v.Line, v.Column})
			case "parallelism":
				st.Parallelism = l.integer(v, "parallelism", 1, 1024)
			case "retry":
				l.retry(v, &st.Retry)
			case "timeout":
				st.Timeout = l.duration(v, "timeout")
			case "concurrency":
				st.Concurrency, st.concurrencyNode = l.stepConcurrency(v), v
			case "runs_on":
				st.RunsOn = l.runsOn(v, "the step's")
			case "rate_limit":
				st.RateLimit = l.rateLimit(v)
			case "if":
				st.If = l.str(v, "if")
				st.templates = append(st.templates, tmplAt{"if", st.If, v.Line, v.Column})
			}
		})
		if sn.Kind != yaml.MappingNode {
			l.stepsBroken = true
			continue
		}
		switch {
		case nameNode == nil:
			l.fail(sn, "add `name: ...` to the step", "a step has no name")
		case !validName(st.Name):
			l.fail(nameNode, "use 1-64 of a-z, 0-9, '-' and '_'", "step name %q is not allowed", st.Name)
		case w.byName[st.Name] != nil:
			l.fail(nameNode, "step names must be unique", "step %q is defined twice (first on line %d)", st.Name, w.byName[st.Name].Line)
		default:
			w.byName[st.Name] = st
		}
		if w.byName[st.Name] != st || graphKeys {
			l.stepsBroken = true
		}
		if st.Uses == "" {
			l.fail(sn, "add e.g. `uses: exec`", "step %q has no `uses`", st.Name)
		}
		w.Steps = append(w.Steps, st)
	}
}

func (l *loader) retry(n *yaml.Node, r *Retry) {
	l.mapping(n, "retry", []string{"max_attempts", "initial_interval", "max_interval", "multiplier"}, func(key string, _, v *yaml.Node) {
		switch key {
		case "max_attempts":
			r.MaxAttempts = l.integer(v, "max_attempts", 1, 1000)
		case "initial_interval":
			r.InitialInterval = l.duration(v, "initial_interval")
		case "max_interval":
			r.MaxInterval = l.duration(v, "max_interval")
		case "multiplier":
			var f float64
			if v.Decode(&f) != nil || f < 1 || f > 100 {
				l.fail(v, "a number from 1 to 100", "multiplier must be a number from 1 to 100")
			}
			r.Multiplier = f
		}
	})
}

func collectTemplates(n *yaml.Node, where string, out *[]tmplAt) {
	switch n.Kind {
	case yaml.ScalarNode:
		if strings.Contains(n.Value, "{{") {
			*out = append(*out, tmplAt{where, n.Value, n.Line, n.Column})
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			collectTemplates(n.Content[i+1], where+"."+n.Content[i].Value, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			collectTemplates(c, fmt.Sprintf("%s[%d]", where, i), out)
		}
	}
}

// normalize turns YAML-decoded values into JSON-like ones (map[string]any, []any,
// float64 for every number) so templates and outputs agree.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = normalize(e)
		}
		return x
	case map[any]any:
		// A mapping whose keys are not all strings ({0: a}, or a flow map of numbers):
		// JSON keys are strings, so they become strings here, as yaml.v3 does for the
		// top level of a map[string]any. Left as it is, the workflow could not be stored
		// (json: unsupported type), though it validated (found by FuzzLoad).
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[fmt.Sprint(k)] = normalize(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
		return x
	case int:
		return float64(x)
	case int64:
		return float64(x)
	case uint64:
		return float64(x)
	}
	return v
}

// CheckType checks a value against an input type.
func CheckType(typ string, v any) error {
	ok := false
	switch typ {
	case "string":
		_, ok = v.(string)
	case "int":
		switch n := v.(type) {
		case int64, int:
			ok = true
		case float64:
			ok = n == float64(int64(n))
		case json.Number:
			_, err := n.Int64()
			ok = err == nil
		}
	case "number":
		switch v.(type) {
		case float64, int64, int, json.Number:
			ok = true
		}
	case "bool":
		_, ok = v.(bool)
	case "list":
		_, ok = v.([]any)
	case "object":
		_, ok = v.(map[string]any)
	}
	if !ok {
		return fmt.Errorf("%s is not of type %s", toText(v), typ)
	}
	return nil
}

// Decode reads a workflow back from its JSON form (as stored with a run).
func Decode(raw []byte) (*Workflow, error) {
	var w Workflow
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("workflow: decode: %w", err)
	}
	w.byName = map[string]*Step{}
	for _, st := range w.Steps {
		w.byName[st.Name] = st
	}
	return &w, nil
}
