package checkpoint

import (
	"fmt"
	"slices"
)

// Approvals (wait.go's approval waits): who counts toward an approval step, and which
// decisions the log refuses because they would change nothing.

// ApprovalRule is who an approval step does not count: Exclude (the run's starter, with
// not_the_starter) and, with NotTheStarter, everyone in the run's InputsBy, who set what
// the approval is about as much as the starter did. IgnoreInputsBy is the latter's
// negative control (testhooks.Hooks.NoInputsByExclude).
type ApprovalRule struct {
	Exclude        string
	NotTheStarter  bool
	IgnoreInputsBy bool
}

// Excludes says why actor's approval does not count under the rule ("" if it does).
func (r *Run) Excludes(rule ApprovalRule, actor string) string {
	switch {
	case actor == "":
		return "an anonymous decision never counts"
	case rule.Exclude != "" && actor == rule.Exclude:
		return fmt.Sprintf("%s started the run, and the step wants people other than its starter (not_the_starter)", actor)
	case rule.NotTheStarter && !rule.IgnoreInputsBy && slices.Contains(r.InputsBy, actor):
		return fmt.Sprintf("%s changed the run's inputs (retry --input), and the step wants people other than those who set what it approves (not_the_starter)", actor)
	}
	return ""
}

// Approvals is what the run's decisions say of an approval step: the distinct people who
// approved it, in order, except those the rule excludes (and anonymous decisions, which
// never count); their comments; and the first rejection, if any.
func (r *Run) Approvals(step string, rule ApprovalRule) (approvers, comments []string, rejected *DecisionRecord) {
	for i := range r.Decisions {
		d := &r.Decisions[i]
		if d.Step != step || d.Actor == "" {
			continue
		}
		if !d.Approve {
			if rejected == nil {
				rejected = d
			}
			continue
		}
		if r.Excludes(rule, d.Actor) != "" || slices.Contains(approvers, d.Actor) {
			continue
		}
		approvers = append(approvers, d.Actor)
		if d.Comment != "" {
			comments = append(comments, d.Comment)
		}
	}
	return approvers, comments, rejected
}

// Rule is the approval rule of a parked approval wait (a park written before
// NotTheStarter existed excluded its starter only when it named one).
func (w *Wait) Rule() ApprovalRule {
	return ApprovalRule{Exclude: w.Exclude, NotTheStarter: w.NotTheStarter || w.Exclude != ""}
}

// decisionIgnored says why a decision would change nothing ("" if it may): the step
// ended (succeeded or skipped: approved, or never asked; failed: rejected or timed out,
// and a retry asks again), or the run waits on the step and the decider's approval would
// not count (excluded, or given before). A decision given before the run reaches its
// step is kept: the park's rule judges it then, as it does every decision.
func (r *Run) decisionIgnored(st *Step, e *Entry, ignoreInputsBy bool) string {
	switch st.Status {
	case StepSucceeded, StepSkipped, StepFailed:
		return fmt.Sprintf("step %s has %s: a decision changes nothing", st.Name, st.Status)
	}
	if !e.Decision.Approve || r.Status != StatusWaiting || r.Waiting.Kind != WaitApproval || r.Waiting.Step != e.Step {
		return ""
	}
	rule := r.Waiting.Rule()
	rule.IgnoreInputsBy = ignoreInputsBy
	if why := r.Excludes(rule, e.Actor); why != "" {
		return "the approval does not count: " + why
	}
	for _, d := range r.Decisions {
		if d.Step == e.Step && d.Approve && d.Actor == e.Actor {
			return fmt.Sprintf("the approval does not count: %s approved step %s before (at sequence %d); approvers are distinct people", e.Actor, e.Step, d.Seq)
		}
	}
	return ""
}
