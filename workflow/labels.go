package workflow

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Labels: `runs_on: [finance]` on a workflow or a step names the worker labels
// (`flowd --labels finance,eu`) a node needs to run it. A run is executed by one
// worker from its claim to its end, so a run needs every label its workflow and any of
// its steps names (Workflow.Labels): its steps all run on a node that has them. A
// handler run needs the workflow's labels and its handler steps'. Labels route work; they
// do not authorise it (docs/decisions.md, "Worker labels").

// MaxLabels is how many labels one runs_on (and one node's --labels) may name.
const MaxLabels = 16

var labelPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidLabel says whether s may be a worker label: 1-63 of a-z, 0-9, '-' and '_',
// starting with a letter or digit (as NATS subject tokens and metric label values take
// them unquoted).
func ValidLabel(s string) bool { return labelPattern.MatchString(s) }

// ParseLabels reads a node's labels from a comma-separated list ("finance,eu"): each
// valid, none twice, at most MaxLabels; the empty string is none. The result is sorted.
func ParseLabels(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for _, part := range strings.Split(s, ",") {
		l := strings.TrimSpace(part)
		if !ValidLabel(l) {
			return nil, fmt.Errorf("label %q is not allowed: use 1-63 of a-z, 0-9, '-' and '_', starting with a letter or digit, comma-separated (finance,eu)", l)
		}
		if slices.Contains(out, l) {
			return nil, fmt.Errorf("label %q is given twice", l)
		}
		out = append(out, l)
	}
	if len(out) > MaxLabels {
		return nil, fmt.Errorf("%d labels; at most %d are allowed", len(out), MaxLabels)
	}
	slices.Sort(out)
	return out, nil
}

// Labels are the labels a node needs to run a run of w: w's runs_on and each step's,
// sorted, each once (nil: any node).
func (w *Workflow) Labels() []string {
	var out []string
	out = append(out, w.RunsOn...)
	for _, st := range w.Steps {
		out = append(out, st.RunsOn...)
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Missing are the labels of need that have does not, in need's order (nil: none).
func Missing(need, have []string) []string {
	var out []string
	for _, l := range need {
		if !slices.Contains(have, l) {
			out = append(out, l)
		}
	}
	return out
}

// runsOn reads a `runs_on:` list of labels (a single label is taken as a list of one).
func (l *loader) runsOn(n *yaml.Node, what string) []string {
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
	}
	if len(items) == 0 || len(items) > MaxLabels {
		l.fail(n, fmt.Sprintf("name 1 to %d labels, e.g. runs_on: [finance]", MaxLabels), "%s runs_on lists %d labels", what, len(items))
		return nil
	}
	var out []string
	for _, it := range items {
		s := l.str(it, what+" runs_on label")
		if s == "" && it.Kind == yaml.ScalarNode {
			l.fail(it, "name a label, e.g. runs_on: [finance]", "%s runs_on has an empty label", what)
			continue
		}
		if s == "" {
			continue
		}
		if !ValidLabel(s) {
			l.fail(it, "use 1-63 of a-z, 0-9, '-' and '_', starting with a letter or digit (as in flowd --labels finance,eu)", "%s runs_on label %q is not allowed", what, s)
			continue
		}
		if slices.Contains(out, s) {
			l.fail(it, "give each label once", "%s runs_on label %q is given twice", what, s)
			continue
		}
		out = append(out, s)
	}
	return out
}
