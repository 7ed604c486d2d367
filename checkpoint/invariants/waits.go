package invariants

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// The third round's rules, each checked on one accepted entry or one run after a
// message: a timer wakes once, a handler runs once per event, an approval counts, a
// child is bound to its parent and within its tree, and a cancel cascades.

// wakeOnce checks an accepted wake: it ends the run's current park, which no wake ended
// before, and not before the park's due time (the run's state before the message says
// it: a step's later parks keep its first park's time).
func (c *Checker) wakeOnce(seq uint64, run *checkpoint.Run, first bool, e checkpoint.Entry) error {
	m := c.model(e.Run)
	switch {
	case m.park != e.ParkSeq:
		return violation("timer", seq, "timer: a wake of the park at sequence %d of %s/%s accepted while the run's park is the one at sequence %d (seq %d)", e.ParkSeq, e.Run, e.Step, m.park, seq)
	case m.parkWoken:
		return violation("timer", seq, "timer: the park at sequence %d of %s/%s woken twice (seq %d)", e.ParkSeq, e.Run, e.Step, seq)
	}
	m.parkWoken = true
	if first && run != nil && run.Waiting != nil && !run.Waiting.Until.IsZero() && e.At.Before(run.Waiting.Until) {
		return violation("timer", seq, "timer: %s/%s woken at %s, before its park's time %s (seq %d)", e.Run, e.Step,
			e.At.UTC().Format(time.RFC3339Nano), run.Waiting.Until.UTC().Format(time.RFC3339Nano), seq)
	}
	return nil
}

func (m *runModel) event(ev string) {
	if m.events == nil {
		m.events = map[string]int{}
	}
	m.events[ev]++
}

// handledOnce counts the handler events message seq brought run id (the run failed or
// was dead-lettered by it: it had not ended before; ended is the event its entries
// brought, for a run a retry of the same message revived) and checks that the run holds
// no more handler runs of an event than the event happened.
func (c *Checker) handledOnce(s State, seq uint64, id string, before *checkpoint.Run, ended string) error {
	r, err := s.Run(id)
	if err != nil {
		return nil // retired, or never submitted
	}
	m := c.model(id)
	if before == nil || !before.Status.Terminal() {
		switch r.Status {
		case checkpoint.StatusFailed:
			m.event(checkpoint.OnFailureEvent)
		case checkpoint.StatusDeadLettered:
			m.event(checkpoint.OnDeadLetterEvent)
		default:
			if ended != "" { // it ended, and a later entry of the message revived it
				m.event(ended)
			}
		}
	}
	runs := map[string]int{}
	for _, h := range r.HandlerRuns {
		for _, ev := range []string{checkpoint.OnFailureEvent, checkpoint.OnDeadLetterEvent, checkpoint.OnDeadlineEvent} {
			if strings.HasPrefix(h, id+".on-"+strings.ReplaceAll(ev[3:], "_", "-")+".") {
				runs[ev]++
			}
		}
	}
	for _, ev := range slices.Sorted(maps.Keys(runs)) {
		if runs[ev] > m.events[ev] {
			return violation("handler", seq, "handler: %s holds %d %s handler runs (%s) for %d %s events (seq %d)", id, runs[ev], ev, strings.Join(r.HandlerRuns, ", "), m.events[ev], ev, seq)
		}
	}
	return nil
}

// approvalCounts checks an accepted decision on run (as it was before the message): an
// approval given while the run waits on its step must count, that is come from a person
// the step's rule does not exclude and who has not approved it before.
func approvalCounts(seq uint64, run *checkpoint.Run, e checkpoint.Entry) error {
	if run == nil || e.Decision == nil || !e.Decision.Approve || run.Status != checkpoint.StatusWaiting ||
		run.Waiting == nil || run.Waiting.Kind != checkpoint.WaitApproval || run.Waiting.Step != e.Step {
		return nil
	}
	rule := run.Waiting.Rule()
	if why := run.Excludes(rule, e.Actor); why != "" {
		return violation("approval", seq, "approval: %s's approval of %s/%s accepted though it cannot count: %s (seq %d)", e.Actor, e.Run, e.Step, why, seq)
	}
	if approvers, _, _ := run.Approvals(e.Step, rule); slices.Contains(approvers, e.Actor) {
		return violation("approval", seq, "approval: %s approved %s/%s again and it was accepted: approvers are distinct people (seq %d)", e.Actor, e.Run, e.Step, seq)
	}
	return nil
}

// cascaded checks that a run cancelled by message seq has no child that has not ended,
// nor has any of its children.
// childBound checks, at a step's accepted commit, that a run under the step's child ID
// (ChildID of its run, step and item) is that step's child: a parent takes only the
// outputs of the run it started, never those of a run a person started under its
// child's ID (which would skip the child's own steps and approvals). A handler run,
// whose ID has the same form, is not a child and is not looked at.
func childBound(s State, seq uint64, e checkpoint.Entry) error {
	id := checkpoint.ChildID(e.Run, e.Step, e.Item)
	r, err := s.Run(id)
	if err != nil || r.Handler != nil {
		return nil
	}
	want := checkpoint.ParentRef{Run: e.Run, Step: e.Step, Item: e.Item}
	if r.Parent == nil || *r.Parent != want {
		by := "started by " + r.StartedBy
		if r.Parent != nil {
			by = fmt.Sprintf("the child of %s", stepItem(r.Parent.Run, r.Parent.Step, r.Parent.Item))
		}
		return violation("child", seq, "child: %s committed while the run under its child ID, %s, is not its child (%s, trigger %s) (seq %d)",
			stepItem(e.Run, e.Step, e.Item), id, by, r.Trigger, seq)
	}
	return nil
}

// childrenBound checks an accepted park on children: each run it waits for is a child
// of the parking step (a parent waiting on a run it did not start would take its
// outcome as its child's).
func childrenBound(s State, seq uint64, e checkpoint.Entry) error {
	if e.Wait == nil || e.Wait.Kind != checkpoint.WaitChild {
		return nil
	}
	for _, id := range e.Wait.Children {
		r, err := s.Run(id)
		if err != nil {
			continue // retired
		}
		if r.Parent == nil || r.Parent.Run != e.Run || r.Parent.Step != e.Step {
			return violation("child", seq, "child: %s/%s parked waiting for %s, which is not its child (started by %q, trigger %s) (seq %d)",
				e.Run, e.Step, id, r.StartedBy, r.Trigger, seq)
		}
	}
	return nil
}

func cascaded(s State, seq uint64, id string) error {
	r, err := s.Run(id)
	if err != nil {
		return nil
	}
	for _, child := range r.Children {
		cr, err := s.Run(child)
		if err != nil {
			continue // retired
		}
		if !cr.Status.Terminal() {
			return violation("cascade", seq, "cascade: %s was cancelled but its child %s is %s (seq %d)", id, child, cr.Status, seq)
		}
		if err := cascaded(s, seq, child); err != nil {
			return err
		}
	}
	return nil
}
