package engine

// People's entries: a signal to a run (Signal) and a decision on an approval (Decide).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// SignalOptions are a signal's data and de-duplication key.
type SignalOptions struct {
	Data json.RawMessage // JSON, or empty
	// ID: the same signal (name and data) sent again with an ID applied before is applied
	// once; another signal with that ID is refused (checkpoint.ErrConflict).
	ID string
	// Trigger is the trigger of a run SignalWithStart starts (default manual; a
	// workflow's message trigger: event).
	Trigger string
}

// Signal sends a signal to a run (checkpoint/wait.go): kept in its inbox until a wait
// step consumes it; a run parked on it wakes. The sender is the server's word for who
// asked (audit.Actor). The same signal sent again under an ID the run holds is answered
// as applied, also once the run has ended. Refused, with nothing written: a run that has
// ended (checkpoint.ErrConflict); a name no wait step of the run's workflow waits for
// (ErrBadInput); an ID applied before to another name or other data
// (checkpoint.ErrConflict).
func (e *Engine) Signal(ctx context.Context, id, name string, opts SignalOptions) error {
	if err := e.running(); err != nil {
		return err
	}
	entry := checkpoint.Entry{Kind: checkpoint.KindSignal, Actor: audit.Actor(ctx), Run: id, Owner: e.cfg.NodeID,
		Signal: &checkpoint.Signal{Name: name, ID: opts.ID, Data: opts.Data}}
	if err := entry.Validate(); err != nil {
		return err
	}
	r, err := e.store.Run(id)
	if err != nil {
		return err
	}
	resent := resentSignal(r, opts.ID)
	if resent != nil {
		if why := resent.Unlike(entry.Signal); why != "" {
			return fmt.Errorf("%w: run %s: %s", checkpoint.ErrConflict, id, why)
		}
		if r.Status.Terminal() {
			// The same signal, applied before the run ended: a caller sending it again
			// (its first answer lost) is answered as the first was.
			return nil
		}
	}
	if r.Status.Terminal() {
		return fmt.Errorf("%w: run %s has ended (%s): a signal reaches only a run that has not", checkpoint.ErrConflict, id, r.Status)
	}
	if err := e.signalTaken(r, name); err != nil {
		return err
	}
	// Judged after the checks above, so that a refused signal costs its sender nothing.
	if err := e.takeSignalBytes(audit.Actor(ctx), len(opts.Data)); err != nil {
		return err
	}
	if resent == nil {
		// The log refuses a signal past the inbox's bounds; refused here first, it costs
		// no log write: 900 KB signals written and then refused slowed every other
		// user's runs 80x.
		if len(r.Inbox) >= checkpoint.MaxInbox {
			return fmt.Errorf("%w: run %s holds %d signals, the most it keeps", checkpoint.ErrConflict, id, checkpoint.MaxInbox)
		}
		if held := r.InboxBytes(); held+len(opts.Data) > checkpoint.MaxInboxBytes && !e.hooks.NoInboxBytes {
			return fmt.Errorf("%w: run %s's inbox holds %d bytes of signal data; %d more would pass its limit of %d bytes", checkpoint.ErrConflict, id, held, len(opts.Data), checkpoint.MaxInboxBytes)
		}
	}
	return e.clog.Writer.Write(ctx, entry).Await(ctx)
}

// signalTaken refuses (ErrBadInput) a signal name that no wait step of the run's
// workflow waits for: kept in the inbox, it would wait there for good, and its sender,
// told it was sent, would wait for a run that never moves. A wait step whose signal is a
// template may wait for any name, so a workflow with one takes every name. Checked at
// the API, not by the log: the log's rule stays what older nodes judge.
func (e *Engine) signalTaken(r *checkpoint.Run, name string) error {
	wf, err := e.specs.OfRun(r)
	if err != nil {
		return err
	}
	return signalTakenBy(wf, r.ID, name)
}

// signalTakenBy is signalTaken for run id of workflow wf.
func signalTakenBy(wf *workflow.Workflow, id, name string) error {
	var names []string
	for _, st := range wf.Steps {
		if st.Uses != steps.KindWait {
			continue
		}
		s, _ := st.With["signal"].(string)
		if s == name || steps.IsTemplate(st.With["signal"]) {
			return nil
		}
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: run %s: no step of workflow %s waits for a signal, so signal %q would never be taken", ErrBadInput, id, wf.Name, name)
	}
	return fmt.Errorf("%w: run %s: no step of workflow %s waits for signal %q, so it would never be taken; its wait steps wait for %s (check the name)", ErrBadInput, id, wf.Name, name, strings.Join(names, ", "))
}

// resentSignal is the signal with this de-duplication key in the run's inbox already
// (nil: none): the log applies the same signal once, whatever its size.
func resentSignal(r *checkpoint.Run, key string) *checkpoint.SignalRecord {
	if key == "" {
		return nil
	}
	for i := range r.Inbox {
		if r.Inbox[i].ID == key {
			return &r.Inbox[i]
		}
	}
	return nil
}

// ErrNoIdentity: an approval or rejection from someone the server gave no name, or whose
// role this node does not know (no --auth here): it would count nobody, so it is refused.
var ErrNoIdentity = errors.New("engine: approvals need people with identities and roles: decide on a node started with --auth")

// ErrNotApprover: the person's role is below the approval step's approvers role.
var ErrNotApprover = errors.New("engine: not an approver of this step")

// Decide approves (approve) or rejects an approval step of a run for the person the
// server names (audit.Actor). step "" is the step the run waits on, or its only
// approval step. The person's role must be the step's approvers role or above it.
func (e *Engine) Decide(ctx context.Context, id, step string, approve bool, comment string) (string, error) {
	if err := e.running(); err != nil {
		return "", err
	}
	actor := audit.Actor(ctx)
	role, known := e.people[actor]
	if actor == "" || !known {
		return "", ErrNoIdentity
	}
	r, err := e.store.Run(id)
	if err != nil {
		return "", err
	}
	if r.Status.Terminal() {
		return "", fmt.Errorf("%w: run %s has ended (%s)", checkpoint.ErrConflict, id, r.Status)
	}
	wf, err := e.specs.OfRun(r)
	if err != nil {
		return "", err
	}
	var approvals []*workflow.Step
	for _, st := range wf.Steps {
		if st.Uses == steps.KindApproval && (step == "" || st.Name == step) {
			approvals = append(approvals, st)
		}
	}
	if step == "" && r.Waiting != nil && r.Waiting.Kind == checkpoint.WaitApproval {
		approvals = []*workflow.Step{wf.Step(r.Waiting.Step)}
	}
	switch {
	case len(approvals) == 0 && step != "":
		return "", fmt.Errorf("%w: run %s has no approval step %q", checkpoint.ErrInvalidEntry, id, step)
	case len(approvals) == 0:
		return "", fmt.Errorf("%w: run %s has no approval step", checkpoint.ErrInvalidEntry, id)
	case len(approvals) > 1:
		return "", fmt.Errorf("%w: run %s has %d approval steps and waits on none: name one with --step", checkpoint.ErrInvalidEntry, id, len(approvals))
	}
	st := approvals[0]
	want, notTheStarter := "operator", false
	if m, ok := st.With["approvers"].(map[string]any); ok {
		if r, ok := m["role"].(string); ok {
			want = r
		}
		notTheStarter = m["not_the_starter"] == true
	}
	if !steps.RoleAtLeast(role, want) {
		return "", fmt.Errorf("%w: %s is %s; step %s needs %s or above", ErrNotApprover, actor, role, st.Name, want)
	}
	// An approval that would not count is refused here, before the log, so that its sender
	// is told (exit 1) instead of reading "approved" and a count it is not in. The log
	// refuses the same while the run waits on the step (checkpoint decisionIgnored), also
	// when this check raced a retry that changed the inputs.
	if approve {
		rule := checkpoint.ApprovalRule{NotTheStarter: notTheStarter, IgnoreInputsBy: e.hooks.NoInputsByExclude}
		if notTheStarter {
			rule.Exclude = r.StartedBy
		}
		if why := r.Excludes(rule, actor); why != "" {
			return "", fmt.Errorf("%w: run %s step %s: the approval does not count: %s", checkpoint.ErrConflict, id, st.Name, why)
		}
		for _, d := range r.Decisions {
			if d.Step == st.Name && d.Approve && d.Actor == actor {
				return "", fmt.Errorf("%w: run %s step %s: the approval does not count: %s approved it before (%s); approvers are distinct people", checkpoint.ErrConflict, id, st.Name, actor, d.At.UTC().Format(time.RFC3339))
			}
		}
	}
	entry := checkpoint.Entry{Kind: checkpoint.KindDecide, Actor: actor, Run: id, Owner: e.cfg.NodeID, Step: st.Name, Item: checkpoint.ItemWhole,
		Decision: &checkpoint.Decision{Approve: approve, Comment: comment}}
	if err := entry.Validate(); err != nil {
		return "", err
	}
	return st.Name, e.clog.Writer.Write(ctx, entry).Await(ctx)
}
