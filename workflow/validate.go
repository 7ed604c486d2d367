package workflow

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/flowrun/flow/steps"
)

// validate checks what needs the whole workflow: step kinds, needs, cycles, that every
// template reads only what it can see, and each step's with against its kind.
//
// Its time is linear in the steps, needs and templates, with one bounded exception: a
// template that reads a step which is not among its own step's needs costs a bit per
// (step, such distinct step read) in the reachability pass, i.e. at most
// MaxSteps²/64 words. (It was a walk of every step's ancestors, quadratic in a chain:
// 74 s of CPU for 20,000 chained steps.)
func (l *loader) validate(w *Workflow, opts Options) {
	if l.kindsAndNeeds(w, opts.Kinds) {
		if order := l.topoOrder(w); order != nil {
			l.references(w, order)
		}
	}
	l.checkWith(w, opts)
	l.checkOutputs(w)
	l.checkStepKeys(w)
}

// checkOutputs checks the workflow's outputs: templates that read inputs, run.id and
// the steps' outputs (any step: they are rendered once every step is done).
func (l *loader) checkOutputs(w *Workflow) {
	inputs := map[string]bool{}
	for _, in := range w.Inputs {
		inputs[in.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(w.Outputs)) {
		at := w.outputsAt[name]
		tmpl, err := ParseTemplate(w.Outputs[name])
		if err != nil {
			l.errs = append(l.errs, l.errAt(at[0], at[1], fmt.Sprintf("output %q: %v", name, err), "templates look like {{ steps.collect.output.count }}"))
			continue
		}
		for _, p := range tmpl.Paths() {
			msg, hint := "", ""
			switch {
			case p[0] == "steps" && (len(p) < 3 || p[2] != "output"):
				msg, hint = "a step reference reads steps.<name>.output", "e.g. {{ steps.collect.output.drivers }}"
			case p[0] == "steps" && w.byName[p[1]] == nil:
				msg, hint = fmt.Sprintf("no step %q", p[1]), stepNamesHint(w)
			case p[0] == "steps":
			case p[0] == "item":
				msg = "item exists only in a step with foreach"
			default:
				msg, hint = checkPath(p, inputs, &Step{}, "output")
			}
			if msg != "" {
				l.errs = append(l.errs, l.errAt(at[0], at[1], fmt.Sprintf("output %q: {{ %s }}: %s", name, strings.Join(p, "."), msg), hint))
			}
		}
	}
}

// kindsAndNeeds checks each step's kind and needs, and reports whether the graph is
// sound enough (every need names another step) for the passes that walk it. An unknown
// kind leaves it sound: the templates are still checked.
func (l *loader) kindsAndNeeds(w *Workflow, kinds KindChecker) bool {
	sound := true
	names := "" // every step's name, for the hint: built once, not per error
	for _, st := range w.Steps {
		if kinds != nil && st.Uses != "" && !kinds(st.Uses) {
			l.errs = append(l.errs, l.errAt(st.usesNode.Line, st.usesNode.Column,
				fmt.Sprintf("step %q uses unknown kind %q", st.Name, st.Uses), "built in: exec, http, sleep, noop, wait, approval, workflow; or register a Go step"))
		}
		if (st.Uses == steps.KindWait || st.Uses == steps.KindApproval) && st.Foreach != "" {
			l.errs = append(l.errs, l.errAt(st.usesNode.Line, st.usesNode.Column,
				fmt.Sprintf("step %q: a %s step cannot have foreach", st.Name, st.Uses), "wait once, in a step of its own, before or after the foreach step"))
		}
		for i, need := range st.Needs {
			n := st.needsNodes[i]
			switch {
			case need == st.Name:
				l.errs = append(l.errs, l.errAt(n.Line, n.Column, fmt.Sprintf("step %q needs itself", st.Name), "remove it from needs"))
				sound = false
			case w.byName[need] == nil:
				sound = false
				if names == "" {
					names = stepNamesHint(w)
				}
				l.errs = append(l.errs, l.errAt(n.Line, n.Column, fmt.Sprintf("step %q needs unknown step %q", st.Name, need), names))
			}
		}
	}
	return sound
}

// topoOrder returns the indexes of w.Steps with every step after its needs (Kahn's
// algorithm: linear, and no recursion as deep as the chain), or nil after reporting a
// cycle.
func (l *loader) topoOrder(w *Workflow) []int {
	index := make(map[*Step]int, len(w.Steps))
	for i, st := range w.Steps {
		index[st] = i
	}
	waiting := make([]int, len(w.Steps)) // needs not yet ordered, duplicates counted
	dependents := make([][]int, len(w.Steps))
	var order []int
	for i, st := range w.Steps {
		waiting[i] = len(st.Needs)
		for _, need := range st.Needs {
			j := index[w.byName[need]]
			dependents[j] = append(dependents[j], i)
		}
		if waiting[i] == 0 {
			order = append(order, i)
		}
	}
	for k := 0; k < len(order); k++ {
		for _, d := range dependents[order[k]] {
			l.ops++
			if waiting[d]--; waiting[d] == 0 {
				order = append(order, d)
			}
		}
	}
	if len(order) < len(w.Steps) {
		cycle := findCycle(w)
		first := w.byName[cycle[0]]
		l.errs = append(l.errs, l.errAt(first.Line, 3, "the steps form a cycle: "+strings.Join(cycle, " -> "), "needs must not loop back"))
		return nil
	}
	return order
}

// references checks every path of every template. A step read must be reachable
// through needs: a direct need is looked up in a set; the others are answered together
// from ancestor bitsets over just the distinct steps read that way, filled in
// topological order.
func (l *loader) references(w *Workflow, order []int) {
	inputs := map[string]bool{}
	for _, in := range w.Inputs {
		inputs[in.Name] = true
	}
	type edge struct{ from, to string }
	direct := map[edge]bool{}
	for _, st := range w.Steps {
		for _, n := range st.Needs {
			direct[edge{st.Name, n}] = true
		}
	}
	// A template's errors wait here, in order, so that the reachability answers can
	// drop the ones that turn out fine.
	type found struct {
		err    *Error
		step   int // with target: whether the step of index step reaches it
		target int // -1: err stands
	}
	var errs []found
	targets := map[string]int{} // step read other than as a direct need -> bit
	var targetSteps []int       // bit -> index in w.Steps
	index := make(map[*Step]int, len(w.Steps))
	for i, st := range w.Steps {
		index[st] = i
	}
	for i, st := range w.Steps {
		for _, t := range st.templates {
			tmpl, err := ParseTemplate(t.src)
			if err != nil {
				errs = append(errs, found{l.errAt(t.line, t.col, fmt.Sprintf("step %q %s: %v", st.Name, t.where, err), "templates look like {{ inputs.date }}"), 0, -1})
				continue
			}
			for _, p := range tmpl.Paths() {
				l.ops++
				msg, hint := checkPath(p, inputs, st, t.where)
				if msg == "" {
					continue
				}
				e := l.errAt(t.line, t.col, fmt.Sprintf("step %q %s: {{ %s }}: %s", st.Name, t.where, strings.Join(p, "."), msg), hint)
				if !isStepRead(p) {
					errs = append(errs, found{e, 0, -1})
					continue
				}
				// msg says "not reachable"; it stands unless a need leads to p[1].
				if direct[edge{st.Name, p[1]}] {
					continue
				}
				ts := w.byName[p[1]]
				if ts == nil {
					errs = append(errs, found{e, 0, -1})
					continue
				}
				bit, ok := targets[p[1]]
				if !ok {
					bit = len(targetSteps)
					targets[p[1]] = bit
					targetSteps = append(targetSteps, index[ts])
				}
				errs = append(errs, found{e, i, bit})
			}
		}
	}
	var reaches func(step, bit int) bool
	if len(targetSteps) > 0 {
		words := (len(targetSteps) + 63) / 64
		bitOf := make([]int, len(w.Steps))
		for i := range bitOf {
			bitOf[i] = -1
		}
		for bit, i := range targetSteps {
			bitOf[i] = bit
		}
		anc := make([]uint64, len(w.Steps)*words) // row i: the targets step i reaches
		for _, i := range order {
			row := anc[i*words : (i+1)*words]
			for _, need := range w.Steps[i].Needs {
				j := index[w.byName[need]]
				for k, x := range anc[j*words : (j+1)*words] {
					row[k] |= x
				}
				l.ops += words
				if b := bitOf[j]; b >= 0 {
					row[b/64] |= 1 << (b % 64)
				}
			}
		}
		reaches = func(step, bit int) bool { return anc[step*words+bit/64]&(1<<(bit%64)) != 0 }
	}
	for _, f := range errs {
		if f.target < 0 || !reaches(f.step, f.target) {
			l.errs = append(l.errs, f.err)
		}
	}
}

// isStepRead reports whether p is a well-formed read of a step's output, the one kind
// of path whose check needs the graph.
func isStepRead(p []string) bool { return p[0] == "steps" && len(p) >= 3 && p[2] == "output" }

// checkWith asks each step's kind about its with, and points a *steps.WithError at the
// value of the key it names (or at the nearest thing written: the mapping holding a
// missing key, or `uses` when there is no with).
func (l *loader) checkWith(w *Workflow, opts Options) {
	if opts.With == nil {
		return
	}
	for _, st := range w.Steps {
		if st.Uses == "" || (opts.Kinds != nil && !opts.Kinds(st.Uses)) {
			continue
		}
		err := opts.With(st.Uses, st.With)
		if err == nil {
			continue
		}
		at := st.withNode
		if at == nil {
			at = st.usesNode
		}
		hint := ""
		var we *steps.WithError
		if errors.As(err, &we) {
			hint = we.Hint
			err = &steps.WithError{Path: we.Path, Msg: we.Msg} // the hint goes in its own place
			if st.withNode != nil {
				at = nodeAt(st.withNode, we.Path)
			}
		} else {
			err = fmt.Errorf("with: %w", err)
		}
		l.errs = append(l.errs, l.errAt(at.Line, at.Column, fmt.Sprintf("step %q (%s): %v", st.Name, st.Uses, err), hint))
	}
}

// nodeAt follows path (keys, and "[i]" for list elements) from n as far as it leads.
func nodeAt(n *yaml.Node, path []string) *yaml.Node {
	for _, p := range path {
		next := (*yaml.Node)(nil)
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == p {
					next = n.Content[i+1]
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(strings.Trim(p, "[]")); err == nil && i >= 0 && i < len(n.Content) {
				next = n.Content[i]
			}
		}
		if next == nil {
			return n
		}
		n = next
	}
	return n
}

// checkPath checks one template path of st. A well-formed step read (isStepRead) is
// reported not reachable: the caller, which knows the graph, decides whether it is.
func checkPath(p []string, inputs map[string]bool, st *Step, where string) (msg, hint string) {
	switch p[0] {
	case "inputs":
		if len(p) < 2 || !inputs[p[1]] {
			return "no such input", "declare it under inputs:, or fix the name"
		}
	case "steps":
		if len(p) < 3 || p[2] != "output" {
			return "a step reference reads steps.<name>.output", "e.g. {{ steps.collect.output.drivers }}"
		}
		return fmt.Sprintf("step %q is not reachable through needs", p[1]), fmt.Sprintf("add %q to needs (directly or through another step)", p[1])
	case "item":
		if st.Foreach == "" || where == "foreach" {
			return "item exists only in the with and if of a step with foreach", ""
		}
	case "run":
		if len(p) != 2 || (p[1] != "id" && p[1] != "epoch" && p[1] != "error" && p[1] != "failed_step" && p[1] != "handler_id") {
			return "run has id, epoch, error, failed_step and (in a handler) handler_id", ""
		}
	case "schedule":
		if len(p) != 2 || !IntervalKeys[p[1]] {
			return "schedule has tick, prev_tick, tick_date and prev_tick_date", "the data interval of a scheduled run: {{ schedule.prev_tick }} to {{ schedule.tick }}"
		}
	default:
		if len(p) == 1 && Helpers[p[0]] {
			return "", ""
		}
		return "unknown name", "templates see inputs, steps.<name>.output, item, run.id, run.epoch, schedule.tick, schedule.prev_tick, yesterday, today and now"
	}
	return "", ""
}

// stepNamesHint lists the steps for a hint, the first few only: a hint with a thousand
// names helps nobody.
func stepNamesHint(w *Workflow) string {
	const most = 20
	var names []string
	for _, s := range w.Steps {
		if len(names) == most {
			return "steps: " + strings.Join(names, ", ") + fmt.Sprintf(" and %d more", len(w.Steps)-most)
		}
		names = append(names, s.Name)
	}
	return "steps: " + strings.Join(names, ", ")
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
