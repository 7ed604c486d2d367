package engine

import (
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// seqOf is the log message of a run's first event of kind (and step, if given).
func seqOf(v *checkpoint.RunView, kind checkpoint.Kind, step string) uint64 {
	for _, ev := range v.Events {
		if ev.Kind == kind && (step == "" || ev.Step == step) && ev.Outcome == "accepted" {
			return ev.Seq
		}
	}
	return 0
}

// The short paths of a run (docs/perf.md, W2): on the leader the first assign rides in
// the submit's message, and the last step's commit carries the run's completion. A
// workflow with a concurrency limit waits for the scheduler; a run that fails writes its
// completion on its own.
func TestRunShortPaths(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	apply(t, e, chainWorkflow("chain", 3))
	v := runToEnd(t, e, "chain", nil)
	if v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run %s: %s", v.Run.ID, v.Run.Status)
	}
	sub, asg := seqOf(v, checkpoint.KindSubmit, ""), seqOf(v, checkpoint.KindAssign, "")
	last, done := seqOf(v, checkpoint.KindCommit, "s3"), seqOf(v, checkpoint.KindComplete, "")
	if sub == 0 || sub != asg || int64(asg) != v.Run.Epoch {
		t.Fatalf("submit in message %d, assign in %d, epoch %d: want one message on the leader", sub, asg, v.Run.Epoch)
	}
	if last == 0 || last != done {
		t.Fatalf("last commit in message %d, completion in %d: want one message", last, done)
	}

	apply(t, e, "name: limited\nconcurrency: 1\nsteps:\n  - name: a\n    uses: noop\n")
	v = runToEnd(t, e, "limited", nil)
	if sub, asg := seqOf(v, checkpoint.KindSubmit, ""), seqOf(v, checkpoint.KindAssign, ""); v.Run.Status != checkpoint.StatusSucceeded || sub == asg {
		t.Fatalf("limited run %s: submit %d, assign %d: a concurrency limit must leave assigning to the scheduler", v.Run.Status, sub, asg)
	}

	apply(t, e, "name: fails\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    needs: [a]\n    uses: exec\n    with: {command: [\"false\"]}\n")
	v = runToEnd(t, e, "fails", nil)
	if v.Run.Status != checkpoint.StatusFailed || v.Run.FailedStep != "b" {
		t.Fatalf("failing run: %s at %q", v.Run.Status, v.Run.FailedStep)
	}
}

// A node that does not lead submits alone; the leader assigns.
func TestSubmitOffTheLeader(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.DisableScheduler = true })
	apply(t, e, chainWorkflow("chain", 2))
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "chain", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.Run(id)
	if err != nil || v.Run.Status != checkpoint.StatusPending || v.Run.Epoch != 0 {
		t.Fatalf("run on a node without a scheduler: %+v %v, want pending without an epoch", v, err)
	}
}

func waitLeader(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.Leading() == nil {
		if time.Now().After(deadline) {
			t.Fatal("no term won within 30s")
		}
		ctx := ctxT(t, time.Second)
		_ = waitFor(ctx, e.clog, func() bool { return e.Leading() != nil })
	}
}
