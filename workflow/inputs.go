package workflow

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ResolveInputs checks inputs against the workflow, converts strings to the declared
// types and fills defaults (rendering helpers such as {{ yesterday }} at `at`, in the
// schedule's timezone).
func ResolveInputs(w *Workflow, given map[string]any, at time.Time) (map[string]any, error) {
	declared := map[string]Input{}
	for _, in := range w.Inputs {
		declared[in.Name] = in
	}
	var unknown []string
	for k := range given {
		if _, ok := declared[k]; !ok {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		var names []string
		for _, in := range w.Inputs {
			names = append(names, in.Name)
		}
		return nil, fmt.Errorf("workflow %s has no input %s (inputs: %s)", w.Name, strings.Join(unknown, ", "), strings.Join(names, ", "))
	}
	loc := time.UTC
	if w.Schedule != nil {
		if l, err := time.LoadLocation(w.Schedule.Timezone); err == nil {
			loc = l
		}
	}
	helpers := map[string]any{
		"now":       at.In(loc).Format(time.RFC3339),
		"today":     at.In(loc).Format("2006-01-02"),
		"yesterday": at.In(loc).AddDate(0, 0, -1).Format("2006-01-02"),
	}
	out := map[string]any{}
	for _, in := range w.Inputs {
		v, ok := given[in.Name]
		if !ok {
			if !in.HasDefault {
				return nil, fmt.Errorf("input %s is required (type %s)", in.Name, in.Type)
			}
			v = in.Default
			if s, isStr := v.(string); isStr && strings.Contains(s, "{{") {
				r, err := renderHelpers(s, helpers)
				if err != nil {
					return nil, fmt.Errorf("input %s default: %v", in.Name, err)
				}
				v = r
			}
		}
		cv, err := convertInput(in, v)
		if err != nil {
			return nil, err
		}
		out[in.Name] = cv
	}
	return out, nil
}

func renderHelpers(src string, helpers map[string]any) (any, error) {
	t, err := ParseTemplate(src)
	if err != nil {
		return nil, err
	}
	return t.Render(helpers)
}

func convertInput(in Input, v any) (any, error) {
	if s, ok := v.(string); ok && in.Type != "string" {
		var conv any
		var err error
		switch in.Type {
		case "int":
			// int64, never float64: 9007199254740993 must arrive as itself.
			conv, err = strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		case "number":
			conv, err = strconv.ParseFloat(strings.TrimSpace(s), 64)
		case "bool":
			conv, err = strconv.ParseBool(strings.TrimSpace(s))
		case "list", "object":
			err = json.Unmarshal([]byte(s), &conv)
		}
		if err != nil {
			return nil, fmt.Errorf("input %s=%q is not a %s", in.Name, s, in.Type)
		}
		v = conv
	}
	switch n := v.(type) {
	case int:
		v = int64(n)
	case json.Number: // from a Go client's JSON: keep an int exact
		if in.Type == "int" {
			i, err := n.Int64()
			if err != nil {
				return nil, fmt.Errorf("input %s=%s is not an int (64-bit)", in.Name, n)
			}
			v = i
		} else if f, err := n.Float64(); err == nil {
			v = f
		}
	}
	if err := CheckType(in.Type, v); err != nil {
		return nil, fmt.Errorf("input %s: %v", in.Name, err)
	}
	return v, nil
}

// TickRunID is the run ID of a workflow's scheduled tick: the same tick always names
// the same run, so a second fire of one tick (a failover, a backfill) is the same run
// and the log refuses it.
func TickRunID(workflow string, tick time.Time) string {
	return workflow + "-" + tick.UTC().Format("20060102T150405Z")
}
