package workflow

import (
	"slices"
	"strings"
)

// Reads names the steps whose outputs step's templates read (in with, foreach and if),
// each once, sorted. Load has checked that each is reachable
// through needs, so these are all the outputs a scope for step must hold.
//
// A run's scopes built from Ancestors hold every ancestor's output: for a chain that is
// n(n-1)/2 entries per run (about a second of CPU at MaxSteps). Reads costs what the
// step's own templates cost to render, and needs no state in the Workflow, so a
// workflow decoded from the log has it too.
func (w *Workflow) Reads(step string) []string {
	st := w.byName[step]
	if st == nil {
		return nil
	}
	var out []string
	add := func(src string) {
		if !strings.Contains(src, "{{") {
			return
		}
		t, err := ParseTemplate(src)
		if err != nil {
			return // Load refused it; rendering will say so again
		}
		for _, p := range t.Paths() {
			if isStepRead(p) {
				out = append(out, p[1])
			}
		}
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			add(x)
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(st.With)
	add(st.Foreach)
	add(st.If)
	slices.Sort(out)
	return slices.Compact(out)
}
