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
		return
	}
	if keyNode == nil || kl.Limit == 0 {
		l.fail(n, `e.g. {key: "{{ inputs.account }}", limit: 1}`, "a concurrency key needs both key and limit")
		return
	}
	if err := checkKeyTemplate(kl.Key); err != nil {
		l.fail(keyNode, `a template over inputs, e.g. "payout-{{ inputs.date }}"`, "concurrency key %q: %v", kl.Key, err)
		return
	}
	for _, have := range w.ConcurrencyKeys {
		if have.Key == kl.Key {
			l.fail(keyNode, "give each key once", "concurrency key %q is given twice", kl.Key)
			return
		}
	}
	w.ConcurrencyKeys = append(w.ConcurrencyKeys, kl)
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
	if len(w.ConcurrencyKeys) == 0 {
		return nil, nil
	}
	out := make([]KeyLimit, 0, len(w.ConcurrencyKeys))
	scope := map[string]any{"inputs": inputs}
	for _, kl := range w.ConcurrencyKeys {
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
