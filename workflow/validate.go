package workflow

import (
	"fmt"
	"slices"
	"strings"
)

// validate checks what needs the whole workflow: step kinds, needs, cycles, and that
// every template reads only what it can see.
func (l *loader) validate(w *Workflow, kinds KindChecker) {
	for _, st := range w.Steps {
		if kinds != nil && st.Uses != "" && !kinds(st.Uses) {
			l.errs = append(l.errs, l.errAt(st.usesNode.Line, st.usesNode.Column,
				fmt.Sprintf("step %q uses unknown kind %q", st.Name, st.Uses), "built in: exec, http, sleep, noop; or register a Go step"))
		}
		for i, need := range st.Needs {
			n := st.needsNodes[i]
			switch {
			case need == st.Name:
				l.errs = append(l.errs, l.errAt(n.Line, n.Column, fmt.Sprintf("step %q needs itself", st.Name), "remove it from needs"))
			case w.byName[need] == nil:
				l.errs = append(l.errs, l.errAt(n.Line, n.Column, fmt.Sprintf("step %q needs unknown step %q", st.Name, need), "steps: "+strings.Join(stepNames(w), ", ")))
			}
		}
	}
	if len(l.errs) > 0 {
		return
	}
	if cycle := findCycle(w); cycle != nil {
		first := w.byName[cycle[0]]
		l.errs = append(l.errs, l.errAt(first.Line, 3, "the steps form a cycle: "+strings.Join(cycle, " -> "), "needs must not loop back"))
		return
	}
	inputs := map[string]bool{}
	for _, in := range w.Inputs {
		inputs[in.Name] = true
	}
	for _, st := range w.Steps {
		ancestors := map[string]bool{}
		for _, a := range w.Ancestors(st.Name) {
			ancestors[a] = true
		}
		for _, t := range st.templates {
			tmpl, err := ParseTemplate(t.src)
			if err != nil {
				l.errs = append(l.errs, l.errAt(t.line, t.col, fmt.Sprintf("step %q %s: %v", st.Name, t.where, err), "templates look like {{ inputs.date }}"))
				continue
			}
			for _, p := range tmpl.Paths() {
				if msg, hint := checkPath(p, inputs, ancestors, st, t.where); msg != "" {
					l.errs = append(l.errs, l.errAt(t.line, t.col, fmt.Sprintf("step %q %s: {{ %s }}: %s", st.Name, t.where, strings.Join(p, "."), msg), hint))
				}
			}
		}
	}
}

func checkPath(p []string, inputs, ancestors map[string]bool, st *Step, where string) (msg, hint string) {
	switch p[0] {
	case "inputs":
		if len(p) < 2 || !inputs[p[1]] {
			return "no such input", "declare it under inputs:, or fix the name"
		}
	case "steps":
		if len(p) < 3 || p[2] != "output" {
			return "a step reference reads steps.<name>.output", "e.g. {{ steps.collect.output.drivers }}"
		}
		if !ancestors[p[1]] {
			return fmt.Sprintf("step %q is not reachable through needs", p[1]), fmt.Sprintf("add %q to needs (directly or through another step)", p[1])
		}
	case "item":
		if st.Foreach == "" || where == "foreach" {
			return "item exists only in the with and if of a step with foreach", ""
		}
	case "run":
		if len(p) != 2 || (p[1] != "id" && p[1] != "epoch") {
			return "run has id and epoch", ""
		}
	default:
		if len(p) == 1 && Helpers[p[0]] {
			return "", ""
		}
		return "unknown name", "templates see inputs, steps.<name>.output, item, run.id, run.epoch, yesterday, today and now"
	}
	return "", ""
}

func stepNames(w *Workflow) []string {
	var out []string
	for _, s := range w.Steps {
		out = append(out, s.Name)
	}
	return out
}

// Ancestors is every step reachable from step through needs, nearest first: the steps
// whose outputs its templates may read.
func (w *Workflow) Ancestors(step string) []string {
	seen := map[string]bool{}
	var out []string
	var walk func(s *Step)
	walk = func(s *Step) {
		for _, n := range s.Needs {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
				if ns := w.byName[n]; ns != nil {
					walk(ns)
				}
			}
		}
	}
	if st := w.byName[step]; st != nil {
		walk(st)
	}
	return out
}

func findCycle(w *Workflow) []string {
	const (
		white = iota
		grey
		black
	)
	color := map[string]int{}
	var stack []string
	var cycle []string
	var visit func(name string) bool
	visit = func(name string) bool {
		color[name] = grey
		stack = append(stack, name)
		for _, n := range w.byName[name].Needs {
			switch color[n] {
			case grey:
				i := slices.Index(stack, n)
				cycle = append(append([]string{}, stack[i:]...), n)
				return true
			case white:
				if visit(n) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[name] = black
		return false
	}
	for _, st := range w.Steps {
		if color[st.Name] == white && visit(st.Name) {
			return cycle
		}
	}
	return nil
}
