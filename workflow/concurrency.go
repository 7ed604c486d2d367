package workflow

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// KeyLimit is one `concurrency: {key, limit}` of a workflow: at most Limit runs whose
// Key renders to the same text hold a slot at once (engine/internal/leader PlanAssign;
// docs/workflow-spec.md "Concurrency keys"). Keys are cluster-wide names: two
// workflows whose keys render alike share the key (each counts against its own limit),
// so a payout and a refund of one account can exclude each other.
type KeyLimit struct {
	Key   string `json:"key"` // a template over inputs
	Limit int    `json:"limit"`
}

// MaxKeyLimits is how many concurrency keys one workflow may declare.
const MaxKeyLimits = 8

// maxKeyText bounds a rendered key, so that a hostile input cannot make every holder's
// key a megabyte in the leader's memory and in `flowctl limits`.
const maxKeyText = 512

// concurrency reads `concurrency:`: a whole number (runs of this workflow at once, as
// before), a {key, limit} mapping, or a list of them.
func (l *loader) concurrency(n *yaml.Node, w *Workflow) {
	switch n.Kind {
	case yaml.ScalarNode:
		w.Concurrency = l.integer(n, "concurrency", 0, 100000)
	case yaml.MappingNode:
		l.keyLimit(n, w)
	case yaml.SequenceNode:
		if len(n.Content) == 0 || len(n.Content) > MaxKeyLimits {
			l.fail(n, fmt.Sprintf("1 to %d {key, limit} mappings", MaxKeyLimits), "concurrency lists %d keys", len(n.Content))
			return
		}
		for _, x := range n.Content {
			l.keyLimit(x, w)
		}
	default:
		l.fail(n, `a number (runs at once) or {key: "{{ inputs.account }}", limit: 1}, or a list of such`, "concurrency must not be %s", kindName(n))
	}
}

func (l *loader) keyLimit(n *yaml.Node, w *Workflow) {
	if kl, ok := l.readKeyLimit(n, w.ConcurrencyKeys); ok {
		w.ConcurrencyKeys = append(w.ConcurrencyKeys, kl)
	}
}

// readKeyLimit reads one {key, limit} mapping, refusing a key given in have already.
func (l *loader) readKeyLimit(n *yaml.Node, have []KeyLimit) (KeyLimit, bool) {
	kl := KeyLimit{}
	var keyNode *yaml.Node
	l.mapping(n, "a concurrency key", []string{"key", "limit"}, func(key string, k, v *yaml.Node) {
		switch key {
		case "key":
			kl.Key, keyNode = l.str(v, "concurrency key"), v
		case "limit":
			kl.Limit = l.integer(v, "concurrency limit", 1, 100000)
		}
	})
	if n.Kind != yaml.MappingNode {
		return kl, false
	}
	if keyNode == nil || kl.Limit == 0 {
		l.fail(n, `e.g. {key: "{{ inputs.account }}", limit: 1}`, "a concurrency key needs both key and limit")
		return kl, false
	}
	if err := checkKeyTemplate(kl.Key); err != nil {
		l.fail(keyNode, `a template over inputs, e.g. "payout-{{ inputs.date }}"`, "concurrency key %q: %v", kl.Key, err)
		return kl, false
	}
	for _, h := range have {
		if h.Key == kl.Key {
			l.fail(keyNode, "give each key once", "concurrency key %q is given twice", kl.Key)
			return kl, false
		}
	}
	return kl, true
}

// stepConcurrency reads a step's `concurrency:`: a {key, limit} mapping or a list of
// them (a step's keys are granted together, so two steps that want the same keys
// cannot each hold one and wait for the other).
func (l *loader) stepConcurrency(n *yaml.Node) []KeyLimit {
	var out []KeyLimit
	one := func(x *yaml.Node) {
		if kl, ok := l.readKeyLimit(x, out); ok {
			out = append(out, kl)
		}
	}
	switch n.Kind {
	case yaml.MappingNode:
		one(n)
	case yaml.SequenceNode:
		if len(n.Content) == 0 || len(n.Content) > MaxKeyLimits {
			l.fail(n, fmt.Sprintf("1 to %d {key, limit} mappings", MaxKeyLimits), "concurrency lists %d keys", len(n.Content))
			return nil
		}
		for _, x := range n.Content {
			one(x)
		}
	default:
		l.fail(n, `{key: "{{ inputs.account }}", limit: 1}, or a list of such (a number of runs at once belongs on the workflow)`, "a step's concurrency must not be %s", kindName(n))
	}
	return out
}

// StepKeys reports whether a step of the workflow (or of a handler) has concurrency keys.
func (w *Workflow) StepKeys() bool {
	for _, st := range w.Steps {
		if len(st.Concurrency) > 0 {
			return true
		}
	}
	for _, hs := range w.Handlers {
		for _, st := range hs {
			if len(st.Concurrency) > 0 {
				return true
			}
		}
	}
	return false
}

// checkStepKeys refuses step keys that could never be granted or would hold a slot
// for nothing: on a step that parks itself (its run gives its slots back when it
// parks), and a key the workflow holds for the whole run (the step would wait for its
// own run: keys are not re-entrant).
func (l *loader) checkStepKeys(w *Workflow) {
	check := func(sts []*Step) {
		for _, st := range sts {
			if len(st.Concurrency) == 0 {
				continue
			}
			if st.Uses == "wait" || st.Uses == "approval" || st.Uses == "sleep" || st.Uses == "workflow" {
				l.fail(st.concurrencyNode, "put the key on the steps that do the work, or on the workflow", "step %q: concurrency on a %s step holds nothing: its run gives its slots back while it waits", st.Name, st.Uses)
				continue
			}
			for _, kl := range st.Concurrency {
				for _, wk := range w.ConcurrencyKeys {
					if wk.Key == kl.Key {
						l.fail(st.concurrencyNode, "drop it from the step: the run holds it from its start to its end", "step %q: concurrency key %q is the workflow's too, and the step would wait for its own run", st.Name, kl.Key)
					}
				}
			}
		}
	}
	check(w.Steps)
	for _, hs := range w.Handlers {
		check(hs)
	}
}

// checkKeyTemplate accepts a non-empty template that reads only inputs: a key is
// rendered by the leader when it admits a run, before any step ran.
func checkKeyTemplate(src string) error {
	if strings.TrimSpace(src) == "" {
		return fmt.Errorf("is empty")
	}
	if len(src) > maxKeyText {
		return fmt.Errorf("is longer than %d bytes", maxKeyText)
	}
	t, err := ParseTemplate(src)
	if err != nil {
		return err
	}
	for _, p := range t.Paths() {
		if len(p) < 2 || p[0] != "inputs" {
			return fmt.Errorf("reads %s; a key can read only inputs (inputs.NAME), it is rendered before any step runs", strings.Join(p, "."))
		}
	}
	return nil
}

// Keys renders the workflow's concurrency keys over a run's inputs, in declaration
// order, each with its limit. A key that does not render (an input the run lacks) is an
// error; callers that must still decide (the leader's admission) use UnrenderedKey.
func (w *Workflow) Keys(inputs map[string]any) ([]KeyLimit, error) {
	return renderKeys(w.ConcurrencyKeys, inputs)
}

// Keys renders the step's concurrency keys over its run's inputs, as Workflow.Keys; a
// key that does not render is counted under UnrenderedKey (every such step of the
// template shares it), so a step lacking its key's input waits with the others like
// it rather than runs unlimited.
func (st *Step) Keys(inputs map[string]any) []KeyLimit {
	keys, err := renderKeys(st.Concurrency, inputs)
	if err == nil {
		return keys
	}
	out := make([]KeyLimit, len(st.Concurrency))
	for i, kl := range st.Concurrency {
		out[i] = KeyLimit{Key: UnrenderedKey(kl.Key), Limit: kl.Limit}
	}
	return out
}

func renderKeys(kls []KeyLimit, inputs map[string]any) ([]KeyLimit, error) {
	if len(kls) == 0 {
		return nil, nil
	}
	out := make([]KeyLimit, 0, len(kls))
	scope := map[string]any{"inputs": inputs}
	for _, kl := range kls {
		t, err := ParseTemplate(kl.Key)
		if err != nil {
			return nil, fmt.Errorf("concurrency key %q: %w", kl.Key, err)
		}
		v, err := t.Render(scope)
		if err != nil {
			return nil, fmt.Errorf("concurrency key %q: %w", kl.Key, err)
		}
		text := toText(v)
		if len(text) > maxKeyText {
			return nil, fmt.Errorf("concurrency key %q renders to %d bytes, more than %d", kl.Key, len(text), maxKeyText)
		}
		out = append(out, KeyLimit{Key: text, Limit: kl.Limit})
	}
	return out, nil
}

// UnrenderedKey is the key a run whose key template does not render is counted under:
// every such run of the template shares it, so a run lacking its key's input is held
// back with the others like it rather than let through unlimited.
func UnrenderedKey(template string) string { return "(unrendered) " + template }
