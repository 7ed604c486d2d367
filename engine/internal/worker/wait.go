package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
)

// Waits (checkpoint/wait.go). A step that waits for the world looks in the run's state
// (this node's, freshly read) for what it waits for: there, it commits (a signal's
// consumption rides in the commit); its timer fired, it times out; neither, it asks the
// epoch to park. The epoch stops starting steps, lets the running ones finish, and
// then writes one park entry: the run waits with no lease and no worker, and the entry
// that brings what it waits for (a signal, a decision, the scheduler's wake) makes it
// pending again for a resumed epoch, which runs the step again.
//
// Whatever arrives between this node's read and its park is not lost: the applier judges
// the park against the state the log has then, and wakes the run at once when what it
// waits for is already there.

// parkRequest is a step's answer "park the run": returned as the step's error.
type parkRequest struct {
	step string
	wait checkpoint.Wait
}

func (p *parkRequest) Error() string {
	return fmt.Sprintf("step %s parks: waits for a %s", p.step, p.wait.Kind)
}

// parkAfter is the shortest sleep that parks instead of holding a worker.
func (p *Pool) parkAfter() time.Duration {
	if p.cfg.ParkAfter > 0 {
		return p.cfg.ParkAfter
	}
	return 3 * p.cfg.TTL
}

// waits reports whether st is carried out here rather than by its kind, given its
// rendered with: a wait, an approval, or a sleep long enough to park.
func (x *runExec) waits(st *workflow.Step, with map[string]any) bool {
	switch {
	case steps.ParksItself(st.Uses):
		return true
	case st.Uses != steps.KindSleep:
		return false
	}
	if _, ok, err := steps.SleepUntil(with); ok || err != nil {
		return true
	}
	d, err := steps.SleepDuration(with)
	return err == nil && d >= x.p.parkAfter()
}

// runWait carries out a waiting step: commit, fail, or return a *parkRequest.
func (x *runExec) runWait(st *workflow.Step, with map[string]any) error {
	r, err := x.p.cfg.State.Run(x.run.ID)
	if err != nil {
		return err
	}
	now := x.p.clock.Now()
	until := func(d time.Duration) time.Time {
		if d <= 0 {
			return time.Time{}
		}
		return now.Add(d) // a later park of the step keeps its first park's deadline
	}
	commit := func(out any, consume uint64) error {
		raw, err := json.Marshal(out)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, err)
		}
		if err := x.commit(checkpoint.Entry{Kind: checkpoint.KindCommit, Step: st.Name, Item: checkpoint.ItemWhole, Output: raw, Attempt: 1, Consume: consume}); err != nil {
			return err
		}
		x.finish(st.Name, decodeOutput(raw))
		return nil
	}
	fail := func(format string, args ...any) error {
		return x.failStep(st, checkpoint.ItemWhole, 1, steps.Permanentf(format, args...))
	}
	switch st.Uses {
	case steps.KindWait:
		w, err := steps.ParseWaitWith(with)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, err)
		}
		if sig := r.NextSignal(w.Signal); sig != nil {
			return commit(map[string]any{"signal": sig.Name, "data": rawOrNull(sig.Data), "sender": sig.Sender, "at": sig.At.UTC().Format(time.RFC3339Nano)}, sig.Seq)
		}
		if r.TimerFired(st.Name) {
			if w.Continue {
				return commit(map[string]any{"signal": w.Signal, "timed_out": true}, 0)
			}
			return fail("wait: no signal %s within %s", w.Signal, w.Timeout)
		}
		return &parkRequest{step: st.Name, wait: checkpoint.Wait{Kind: checkpoint.WaitSignal, Name: w.Signal, Until: until(w.Timeout)}}
	case steps.KindApproval:
		a, err := steps.ParseApprovalWith(with)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, err)
		}
		rule := checkpoint.ApprovalRule{NotTheStarter: a.NotTheStarter, IgnoreInputsBy: x.p.hooks.NoInputsByExclude}
		if a.NotTheStarter {
			rule.Exclude = r.StartedBy
		}
		approvers, comments, rejected := r.Approvals(st.Name, rule)
		switch {
		case rejected != nil:
			return fail("approval: rejected by %s: %s", rejected.Actor, rejected.Comment)
		case len(approvers) >= a.Count:
			if comments == nil {
				comments = []string{}
			}
			return commit(map[string]any{"approved_by": approvers, "comments": comments}, 0)
		case r.TimerFired(st.Name):
			return fail("approval: %d of %d approvals within %s", len(approvers), a.Count, a.Timeout)
		}
		return &parkRequest{step: st.Name, wait: checkpoint.Wait{Kind: checkpoint.WaitApproval, Need: a.Count, Exclude: rule.Exclude, NotTheStarter: a.NotTheStarter, Role: a.Role, Until: until(a.Timeout)}}
	}
	// A sleep that parks: until its time, or for its duration from its first park.
	if r.TimerFired(st.Name) {
		return commit(map[string]any{}, 0)
	}
	at, ok, err := steps.SleepUntil(with)
	if err != nil {
		return x.failStep(st, checkpoint.ItemWhole, 1, err)
	}
	if !ok {
		d, err := steps.SleepDuration(with)
		if err != nil {
			return x.failStep(st, checkpoint.ItemWhole, 1, err)
		}
		at = now.Add(d)
	}
	if t := r.Timers[st.Name]; t != nil {
		at = t.Until
	}
	if !at.After(now) {
		return commit(map[string]any{}, 0) // its time has come (or was in the past)
	}
	return &parkRequest{step: st.Name, wait: checkpoint.Wait{Kind: checkpoint.WaitTimer, Until: at}}
}

func rawOrNull(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 {
		return json.RawMessage("null")
	}
	return raw
}

// park writes the park entry of the epoch's first waiting step.
func (x *runExec) park(p *parkRequest) {
	if err := x.write(checkpoint.Entry{Kind: checkpoint.KindPark, Step: p.step, Item: checkpoint.ItemWhole, Wait: &p.wait}); err != nil {
		x.log.Warn("park not recorded", "step", p.step, "err", err)
		return
	}
	x.p.stats.Parked.Add(1)
	x.log.Info("run parked", "step", p.step, "waits_for", p.wait.Kind)
}

// parkFirst is the wait of a and b (a may be nil) that the run parks on: the one that
// times out or fires first (one without a time last), then the step first in the
// workflow's order. A parked run waits for one wait; its siblings ask again when it
// wakes (docs/workflow-spec.md, "Waits side by side").
func (x *runExec) parkFirst(a, b *parkRequest) *parkRequest {
	if a == nil {
		return b
	}
	ua, ub := a.wait.Until, b.wait.Until
	switch {
	case ua.IsZero() != ub.IsZero():
		if ua.IsZero() {
			return b
		}
		return a
	case !ua.Equal(ub):
		if ub.Before(ua) {
			return b
		}
		return a
	}
	order := func(step string) int {
		return slices.IndexFunc(x.wf.Steps, func(s *workflow.Step) bool { return s.Name == step })
	}
	if order(b.step) < order(a.step) {
		return b
	}
	return a
}

func asPark(err error) *parkRequest {
	var p *parkRequest
	if errors.As(err, &p) {
		return p
	}
	return nil
}
