package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/audit"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// Waits (issue 26; checkpoint/wait.go, engine/internal/worker/wait.go): runs park on a
// signal, people's approvals or a timer, holding no lease and no worker, and resume
// with an epoch that does not count. The state machine's rules and their guards are in
// checkpoint/testdata/waits.txt; these tests run them through a whole engine on a real
// embedded NATS server and a real Pebble.

// awaitRun waits, on the applier's progress, until the run satisfies cond.
func awaitRun(t *testing.T, e *Engine, id string, d time.Duration, what string, cond func(*checkpoint.Run) bool) *checkpoint.Run {
	t.Helper()
	deadline := time.After(d)
	for {
		changed := e.Changed()
		if r, err := e.store.Run(id); err == nil && cond(r) {
			return r
		}
		select {
		case <-changed:
		case <-deadline:
			r, _ := e.store.Run(id)
			t.Fatalf("run %s: timed out after %s waiting for %s; it is %+v", id, d, what, r)
		}
	}
}

func isStatus(s checkpoint.RunStatus) func(*checkpoint.Run) bool {
	return func(r *checkpoint.Run) bool { return r.Status == s }
}

func stepOutput(t *testing.T, e *Engine, id, step string) map[string]any {
	t.Helper()
	v, err := e.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range v.Steps {
		if st.Name == step {
			var out map[string]any
			if err := json.Unmarshal(st.Output, &out); err != nil {
				t.Fatalf("step %s output %s: %v", step, st.Output, err)
			}
			return out
		}
	}
	t.Fatalf("run %s has no step %s", id, step)
	return nil
}

// A parked run holds no lease, no task and no worker; the signal wakes it; its new
// epoch's reason is "resumed" and does not count toward max_epochs (1 here: a counted
// epoch change would dead-letter it); the wait step's output is the signal's data, its
// sender and time.
func TestParkedRunHoldsNothingAndResumesOnASignal(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: ledger
max_epochs: 1
steps:
  - {name: close, uses: wait, with: {signal: ledger-closed, timeout: 1h}}
  - {name: after, needs: [close], uses: noop}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(audit.WithActor(ctx, "ann"), "ledger", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	if r.Waiting == nil || r.Waiting.Kind != checkpoint.WaitSignal || r.Waiting.Step != "close" || r.Waiting.Name != "ledger-closed" || r.Waiting.Until.IsZero() {
		t.Fatalf("waiting: %+v", r.Waiting)
	}
	if r.Owner != "" || r.StartedBy != "ann" {
		t.Fatalf("owner %q started by %q", r.Owner, r.StartedBy)
	}
	if assigned, running := e.store.Held(); assigned != 0 || running != 0 {
		t.Fatalf("a parked run holds an epoch: %d assigned, %d running", assigned, running)
	}
	// The epoch releases its lease on its way out, in the background (execute): the
	// lease bucket is another process's state to poll, with a deadline.
	pollUntil(t, 5*time.Second, "the parked run's lease released", func() bool {
		_, held, err := e.leases.Holder(ctx, id)
		return err == nil && !held
	})
	if err := e.Signal(audit.WithActor(ctx, "fin"), id, "ledger-closed", SignalOptions{Data: json.RawMessage(`{"total":1200}`)}); err != nil {
		t.Fatal(err)
	}
	end, err := e.WaitRun(ctx, id)
	if err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("after the signal: %v %+v", err, end)
	}
	if n := len(end.Epochs); n != 2 || end.Epochs[1].Reason != checkpoint.ReasonResumed || end.EpochChanges != 0 {
		t.Fatalf("epochs %+v, changes %d: want a second epoch, resumed, not counted", end.Epochs, end.EpochChanges)
	}
	out := stepOutput(t, e, id, "close")
	if out["signal"] != "ledger-closed" || out["sender"] != "fin" || fmt.Sprint(out["data"]) != "map[total:1200]" || out["at"] == nil {
		t.Fatalf("wait output %v", out)
	}
	if got := e.workers.Stats().Parked.Load(); got != 1 {
		t.Fatalf("parked %d times", got)
	}
	// An ended run cannot be signalled.
	if err := e.Signal(ctx, id, "ledger-closed", SignalOptions{}); !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("signal to an ended run: %v", err)
	}
}

// A signal sent while the run is still on an earlier step is kept and delivered when it
// reaches its wait, which then completes without parking. The control drops a signal
// that finds no wait for it (Hooks.NoEarlySignals): the run parks, the signal lost.
func TestSignalSentBeforeTheWaitIsDelivered(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "control-no-early-signals"}[control], func(t *testing.T) {
			e := startEngineWith(t, &testhooks.Hooks{NoEarlySignals: control}, nil)
			gate := filepath.Join(t.TempDir(), "gate")
			apply(t, e, fmt.Sprintf(`
name: early
steps:
  - {name: first, uses: exec, with: {command: [sh, -c, "while [ ! -f %s ]; do sleep 0.05; done"]}}
  - {name: go, needs: [first], uses: wait, with: {signal: go}}
`, gate))
			ctx := ctxT(t, 30*time.Second)
			id, err := e.StartRun(ctx, "early", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 15*time.Second, "running", isStatus(checkpoint.StatusRunning))
			if err := e.Signal(ctx, id, "go", SignalOptions{Data: json.RawMessage(`"early"`)}); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if control {
				r := awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
				if len(r.Inbox) != 0 {
					t.Fatalf("the control kept the signal: %+v", r.Inbox)
				}
				return
			}
			end, err := e.WaitRun(ctx, id)
			if err != nil || end.Status != checkpoint.StatusSucceeded || len(end.Epochs) != 1 {
				t.Fatalf("%v %+v: want succeeded in its first epoch, without parking", err, end)
			}
			if out := stepOutput(t, e, id, "go"); out["data"] != "early" {
				t.Fatalf("wait output %v", out)
			}
		})
	}
}

// A signal repeated with the same --id is applied once: of two waits on it, the second
// still waits. The control applies it twice (Hooks.NoSignalDedup): both waits complete.
func TestRepeatedSignalIDIsAppliedOnce(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "once", true: "control-no-dedup"}[control], func(t *testing.T) {
			e := startEngineWith(t, &testhooks.Hooks{NoSignalDedup: control}, nil)
			apply(t, e, `
name: twice
steps:
  - {name: one, uses: wait, with: {signal: go}}
  - {name: two, needs: [one], uses: wait, with: {signal: go}}
`)
			ctx := ctxT(t, 30*time.Second)
			id, err := e.StartRun(ctx, "twice", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
			for range 2 { // a client retrying after a timeout
				if err := e.Signal(ctx, id, "go", SignalOptions{ID: "k-1"}); err != nil {
					t.Fatal(err)
				}
			}
			if control {
				if end, err := e.WaitRun(ctx, id); err != nil || end.Status != checkpoint.StatusSucceeded {
					t.Fatalf("control: %v %+v", err, end)
				}
				return
			}
			r := awaitRun(t, e, id, 15*time.Second, "parked on the second wait", func(r *checkpoint.Run) bool {
				return r.Status == checkpoint.StatusWaiting && r.Waiting.Step == "two"
			})
			if len(r.Inbox) != 1 || r.Inbox[0].ConsumedBy != "one" {
				t.Fatalf("inbox %+v: want the one signal, consumed by step one", r.Inbox)
			}
		})
	}
}

// Approvals: two operators other than the starter. The starter's approval and a second
// approval by the same person do not count; a viewer is refused; the second distinct
// approver completes the step, whose output names them. A rejection fails the run. A
// node without --auth knows nobody's role and refuses to count anyone.
func TestApprovalsCountDistinctPeopleOtherThanTheStarter(t *testing.T) {
	e := startEngine(t, func(c *Config) {
		c.NATSAuth = true
		c.NATSUsers = []NATSUser{{Name: "ann", Password: "pw-ann-1", Role: "operator"}, {Name: "bob", Password: "pw-bob-1", Role: "operator"},
			{Name: "cat", Password: "pw-cat-1", Role: "admin"}, {Name: "vic", Password: "pw-vic-1", Role: "viewer"}}
	})
	apply(t, e, `
name: four-eyes
steps:
  - {name: approve, uses: approval, with: {approvers: {role: operator, count: 2, not_the_starter: true}, timeout: 1h}}
  - {name: transfer, needs: [approve], uses: noop}
`)
	ctx := ctxT(t, 30*time.Second)
	as := func(who string) context.Context { return audit.WithActor(ctx, who) }
	id, err := e.StartRun(as("ann"), "four-eyes", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	// The starter's approval and a repeat do not count, and say so (flowctl: exit 1).
	for i, who := range []string{"ann", "bob", "bob"} {
		_, err := e.Decide(as(who), id, "", true, "ok by "+who)
		switch want := []string{"ann started the run", "", "bob approved it before"}[i]; {
		case want == "" && err != nil:
			t.Fatalf("%s: %v", who, err)
		case want != "" && (!errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), "does not count: "+want)):
			t.Fatalf("%s's approval that does not count: %v; want a conflict saying %q", who, err, want)
		}
	}
	if _, err := e.Decide(as("vic"), id, "", true, ""); !errors.Is(err, ErrNotApprover) {
		t.Fatalf("a viewer's approval: %v", err)
	}
	if _, err := e.Decide(as("mallory"), id, "", true, ""); !errors.Is(err, ErrNoIdentity) {
		t.Fatalf("an unknown person's approval: %v", err)
	}
	r := awaitRun(t, e, id, 5*time.Second, "bob's decision applied", func(r *checkpoint.Run) bool { return len(r.Decisions) == 1 })
	if r.Status != checkpoint.StatusWaiting {
		t.Fatalf("the starter's and a repeated approval counted: %s", r.Status)
	}
	if w := wireWaiting(r); w == nil || fmt.Sprint(w.ApprovedBy) != "[bob]" || w.Need != 2 {
		t.Fatalf("run get's wait %+v: want 1 of 2, approved by bob", w)
	}
	if _, err := e.Decide(as("cat"), id, "approve", true, "fine"); err != nil {
		t.Fatal(err)
	}
	end, err := e.WaitRun(ctx, id)
	if err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, end)
	}
	out := stepOutput(t, e, id, "approve")
	if fmt.Sprint(out["approved_by"]) != "[bob cat]" {
		t.Fatalf("approved_by %v", out["approved_by"])
	}
	// A rejection fails the step and the run.
	id2, err := e.StartRun(as("ann"), "four-eyes", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id2, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	if _, err := e.Decide(as("bob"), id2, "", false, "the total is wrong"); err != nil {
		t.Fatal(err)
	}
	end, err = e.WaitRun(ctx, id2)
	if err != nil || end.Status != checkpoint.StatusFailed || end.FailedStep != "approve" {
		t.Fatalf("%v %+v", err, end)
	}
}

// Without --auth nobody has a role here: an approval is refused, never counted as
// anonymous.
func TestApprovalWithoutAuthIsRefused(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: four-eyes
steps:
  - {name: approve, uses: approval, with: {approvers: {role: operator, count: 1}}}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "four-eyes", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	for _, who := range []string{"", "ann"} {
		if _, err := e.Decide(audit.WithActor(ctx, who), id, "", true, ""); !errors.Is(err, ErrNoIdentity) {
			t.Fatalf("%q without --auth: %v", who, err)
		}
	}
}

// Timers: a sleep longer than ParkAfter parks (kind timer) and the leader's wake ends
// it; a wait's timeout continues (on_timeout: continue) or fails the run.
func TestTimersWakeParkedRuns(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.ParkAfter = 500 * time.Millisecond })
	apply(t, e, `
name: timers
inputs:
  on_timeout: {type: string, default: continue}
steps:
  - {name: nap, uses: sleep, with: {duration: 1s}}
  - {name: w, needs: [nap], uses: wait, with: {signal: never, timeout: 1s, on_timeout: "{{ inputs.on_timeout }}"}}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "timers", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := awaitRun(t, e, id, 15*time.Second, "parked on its sleep", isStatus(checkpoint.StatusWaiting))
	if r.Waiting.Kind != checkpoint.WaitTimer || r.Waiting.Step != "nap" {
		t.Fatalf("waiting %+v", r.Waiting)
	}
	end, err := e.WaitRun(ctx, id)
	if err != nil || end.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, end)
	}
	if out := stepOutput(t, e, id, "w"); out["timed_out"] != true {
		t.Fatalf("wait output %v", out)
	}
	var reasons []string
	for _, ep := range end.Epochs {
		reasons = append(reasons, ep.Reason)
	}
	if !slices.Equal(reasons, []string{checkpoint.ReasonAssigned, checkpoint.ReasonResumed, checkpoint.ReasonResumed}) {
		t.Fatalf("epochs %v", reasons)
	}
	id2, err := e.StartRun(ctx, "timers", map[string]any{"on_timeout": "fail"}, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	end, err = e.WaitRun(ctx, id2)
	if err != nil || end.Status != checkpoint.StatusFailed || end.FailedStep != "w" {
		t.Fatalf("%v %+v", err, end)
	}
}

// Four eyes stay four (issue 36): an operator who changed the run's inputs (retry --from
// with --input) is as interested as its starter, so with not_the_starter her approval
// does not count and she is told; two others complete it. A rejection after the step
// succeeded changes nothing and says so. Control: NoInputsByExclude, her approval counts
// (1 of 2) and one more person completes the step.
func TestApprovalExcludesWhoChangedTheInputs(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-inputs-changer-counts"}[control], func(t *testing.T) {
			h := &testhooks.Hooks{NoInputsByExclude: control}
			e := startEngineWith(t, h, func(c *Config) {
				c.NATSAuth = true
				c.NATSUsers = []NATSUser{{Name: "sam", Password: "pw-sam-1", Role: "operator"}, {Name: "otto", Password: "pw-otto-1", Role: "operator"},
					{Name: "ann", Password: "pw-ann-1", Role: "operator"}, {Name: "bob", Password: "pw-bob-1", Role: "operator"}}
			})
			apply(t, e, `
name: pay
inputs:
  cents: {type: int, default: 100}
steps:
  - {name: compute, uses: noop, with: {cents: "{{ inputs.cents }}"}}
  - {name: approve, needs: [compute], uses: approval, with: {approvers: {role: operator, count: 2, not_the_starter: true}, timeout: 1h}}
  - {name: transfer, needs: [approve], uses: noop}
`)
			ctx := ctxT(t, 60*time.Second)
			as := func(who string) context.Context { return audit.WithActor(ctx, who) }
			id, err := e.StartRun(as("sam"), "pay", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
			for _, who := range []string{"ann", "bob"} {
				if _, err := e.Decide(as(who), id, "", true, ""); err != nil {
					t.Fatal(err)
				}
			}
			if end, err := e.WaitRun(ctx, id); err != nil || end.Status != checkpoint.StatusSucceeded {
				t.Fatalf("%v %+v", err, end)
			}
			if _, err := e.Decide(as("bob"), id, "approve", false, "too late"); !errors.Is(err, checkpoint.ErrConflict) {
				t.Fatalf("a rejection after the run ended: %v; want a conflict", err)
			}
			// Otto sets a new amount and retries from compute: the approval asks again.
			if err := e.RetryFrom(as("otto"), id, RetryOptions{From: "compute", Inputs: map[string]any{"cents": "999999999"}}); err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 15*time.Second, "waiting again", func(r *checkpoint.Run) bool {
				return r.Status == checkpoint.StatusWaiting && len(r.Decisions) == 0
			})
			_, err = e.Decide(as("otto"), id, "", true, "")
			if control {
				if err != nil {
					t.Fatalf("control: otto's approval: %v", err)
				}
				awaitRun(t, e, id, 5*time.Second, "otto's approval applied", func(r *checkpoint.Run) bool { return len(r.Decisions) == 1 })
				if _, err := e.Decide(as("ann"), id, "", true, ""); err != nil {
					t.Fatal(err)
				}
				if end, err := e.WaitRun(ctx, id); err != nil || end.Status != checkpoint.StatusSucceeded {
					t.Fatalf("control: %v %+v", err, end)
				}
				if out := stepOutput(t, e, id, "approve"); fmt.Sprint(out["approved_by"]) != "[otto ann]" {
					t.Fatalf("control: approved_by %v; want the interested otto among the two", out["approved_by"])
				}
				return
			}
			if !errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), "otto changed the run's inputs") {
				t.Fatalf("otto's approval of the amount he set: %v; want a conflict saying why", err)
			}
			if _, err := e.Decide(as("ann"), id, "", true, ""); err != nil {
				t.Fatal(err)
			}
			r := awaitRun(t, e, id, 5*time.Second, "ann's approval applied", func(r *checkpoint.Run) bool { return len(r.Decisions) == 1 })
			if w := wireWaiting(r); w == nil || fmt.Sprint(w.ApprovedBy) != "[ann]" || r.Status != checkpoint.StatusWaiting {
				t.Fatalf("%s %+v: want 1 of 2, approved by ann", r.Status, w)
			}
			if _, err := e.Decide(as("bob"), id, "", true, ""); err != nil {
				t.Fatal(err)
			}
			if end, err := e.WaitRun(ctx, id); err != nil || end.Status != checkpoint.StatusSucceeded {
				t.Fatalf("%v %+v", err, end)
			}
			if out := stepOutput(t, e, id, "approve"); fmt.Sprint(out["approved_by"]) != "[ann bob]" {
				t.Fatalf("approved_by %v", out["approved_by"])
			}
		})
	}
}

// A run's inbox holds at most MaxInboxBytes of signal data (issue 36): a signal past it
// is refused before it is written (one of 900 KB after another costs the log nothing),
// a resend of an applied signal key is applied once as before, and a small signal still
// fits. Control: NoInboxBytes, the second 900 KB signal is kept.
func TestInboxIsBoundedInBytes(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "bounded", true: "control-no-byte-limit"}[control], func(t *testing.T) {
			e := startEngineWith(t, &testhooks.Hooks{NoInboxBytes: control}, nil)
			// Parked on never; the signals it is sent are for its later steps.
			apply(t, e, "name: gate\nsteps:\n  - {name: w, uses: wait, with: {signal: never}}\n"+
				"  - {name: b, needs: [w], uses: wait, with: {signal: big}}\n  - {name: s, needs: [w], uses: wait, with: {signal: small}}\n")
			ctx := ctxT(t, 30*time.Second)
			id, err := e.StartRun(ctx, "gate", nil, RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
			big := json.RawMessage(`"` + strings.Repeat("x", 900_000) + `"`)
			// Each signal from another person: one person's rate (signalrate.go) is not
			// what this test is about.
			who := 0
			as := func() context.Context { who++; return audit.WithActor(ctx, fmt.Sprintf("p%d", who)) }
			if err := e.Signal(as(), id, "big", SignalOptions{Data: big, ID: "k1"}); err != nil {
				t.Fatal(err)
			}
			applied := e.store.Applied()
			err = e.Signal(as(), id, "big", SignalOptions{Data: big})
			if control {
				if err != nil {
					t.Fatalf("control: %v", err)
				}
				if r, _ := e.store.Run(id); r.InboxBytes() < 1_800_000 {
					t.Fatalf("control: the inbox holds %d bytes; want both signals kept", r.InboxBytes())
				}
				return
			}
			if !errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), "would pass its limit of 1048576 bytes") {
				t.Fatalf("a second 900 KB signal: %v; want it refused at the limit", err)
			}
			if e.store.Applied() != applied {
				t.Fatalf("the refused signal was written to the log (applied %d -> %d)", applied, e.store.Applied())
			}
			if err := e.Signal(as(), id, "big", SignalOptions{Data: big, ID: "k1"}); err != nil {
				t.Fatalf("a resend of an applied signal key: %v; want it applied once", err)
			}
			if err := e.Signal(as(), id, "small", SignalOptions{Data: json.RawMessage(`{"ok":true}`)}); err != nil {
				t.Fatal(err)
			}
			if r, _ := e.store.Run(id); len(r.Inbox) != 2 || r.InboxBytes() > checkpoint.MaxInboxBytes {
				t.Fatalf("inbox %d signals, %d bytes", len(r.Inbox), r.InboxBytes())
			}
		})
	}
}

// Issue 38: a signal that no step could ever take is refused, with nothing written: a
// name no wait step of the run's workflow waits for (a typo would sit in the inbox for
// good), and a signal ID applied before with other data or another name (the store keeps
// the first, so the second would be lost without a word). The same signal again under
// its ID stays harmless: a client retrying after a timeout.
func TestSignalsNoStepCanTakeAreRefused(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, `
name: close
steps:
  - {name: one, uses: wait, with: {signal: go}}
  - {name: two, needs: [one], uses: wait, with: {signal: stop}}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "close", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	awaitRun(t, e, id, 15*time.Second, "waiting", isStatus(checkpoint.StatusWaiting))
	applied := e.store.Applied()
	unchanged := func(what string) {
		t.Helper()
		if e.store.Applied() != applied {
			t.Fatalf("%s was written to the log (applied %d -> %d)", what, applied, e.store.Applied())
		}
	}

	err = e.Signal(ctx, id, "og", SignalOptions{})
	if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), `signal "og"`) || !strings.Contains(err.Error(), "go, stop") {
		t.Fatalf("a signal no step waits for: %v; want bad input naming the signal and the names the steps wait for", err)
	}
	if ce := (*client.Error)(nil); !errors.As(wireError(err), &ce) || ce.Code != client.CodeBadRequest {
		t.Fatalf("on the wire: %v; want %s", wireError(err), client.CodeBadRequest)
	}
	unchanged("a signal no step waits for")

	if err := e.Signal(ctx, id, "stop", SignalOptions{ID: "k1", Data: json.RawMessage(`{"n":1}`)}); err != nil {
		t.Fatal(err)
	}
	if err := e.Signal(ctx, id, "stop", SignalOptions{ID: "k1", Data: json.RawMessage(`{ "n": 1 }`)}); err != nil {
		t.Fatalf("the same signal again under its ID: %v; want it applied once, harmlessly", err)
	}
	applied = e.store.Applied()
	err = e.Signal(ctx, id, "stop", SignalOptions{ID: "k1", Data: json.RawMessage(`{"n":2}`)})
	if !errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), `"k1"`) || !strings.Contains(err.Error(), "other data") {
		t.Fatalf("the ID again with other data: %v; want a conflict saying the ID holds other data", err)
	}
	if ce := (*client.Error)(nil); !errors.As(wireError(err), &ce) || ce.Code != client.CodeConflict {
		t.Fatalf("on the wire: %v; want %s", wireError(err), client.CodeConflict)
	}
	unchanged("the ID again with other data")
	err = e.Signal(ctx, id, "go", SignalOptions{ID: "k1", Data: json.RawMessage(`{"n":1}`)})
	if !errors.Is(err, checkpoint.ErrConflict) || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("the ID again for another signal: %v; want a conflict", err)
	}
	unchanged("the ID again for another signal")
	if r, _ := e.store.Run(id); r.Status != checkpoint.StatusWaiting || len(r.Inbox) != 1 || string(r.Inbox[0].Data) != `{"n":1}` {
		t.Fatalf("run %s, inbox %+v: want it waiting with the first signal only", r.Status, r.Inbox)
	}
}
