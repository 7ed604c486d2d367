package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/worker"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/port"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/steps"
	"github.com/flowrun/flow/workflow"
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
	apply(t, e, workflow.ChainYAML("chain", 3))
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

	// A given run ID takes the scheduler's path: its submit may be a refused repeat.
	ctx := ctxT(t, 30*time.Second)
	if _, err := e.StartRun(ctx, "chain", nil, RunOptions{ID: "given-id"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.WaitRun(ctx, "given-id"); err != nil {
		t.Fatal(err)
	}
	v, _ = e.Run("given-id")
	if sub, asg := seqOf(v, checkpoint.KindSubmit, ""), seqOf(v, checkpoint.KindAssign, ""); sub == asg {
		t.Fatalf("a run with a given ID was assigned in its submit's message (%d)", sub)
	}
	if _, err := e.StartRun(ctx, "chain", nil, RunOptions{ID: "given-id"}); !errors.Is(err, checkpoint.ErrRunExists) {
		t.Fatalf("a repeated run ID: %v, want ErrRunExists", err)
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

// A node that does not lead submits alone, in a message of its own; the leader, on
// another node, assigns the run from the applied submit and the run finishes. Without the
// leader's reaction to a submit it did not write, the run stays pending.
func TestSubmitOffTheLeader(t *testing.T) {
	a := startEngine(t, func(c *Config) { c.NATSListen = "127.0.0.1:0" })
	waitLeader(t, a)
	b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = a.ClientURL(); c.DisableScheduler = true })
	apply(t, b, workflow.ChainYAML("chain", 2))
	ctx := ctxT(t, 30*time.Second)
	id, err := b.StartRun(ctx, "chain", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	r, err := b.WaitRun(wctx, id)
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		r, _ := b.store.Run(id)
		t.Fatalf("a run submitted off the leader: %v, run %+v; want it assigned by the leader and finished", err, r)
	}
	v, err := b.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	sub, asg := seqOf(v, checkpoint.KindSubmit, ""), seqOf(v, checkpoint.KindAssign, "")
	if sub == 0 || asg <= sub {
		t.Fatalf("submit in message %d, assign in %d: want the submit alone and the leader's assign after it", sub, asg)
	}
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindAssign && ev.Seq == asg && ev.Owner != "node-a" {
			t.Fatalf("the assign was written by %q, want the leader node-a", ev.Owner)
		}
	}
}

func waitLeader(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.leading() == nil {
		if time.Now().After(deadline) {
			t.Fatal("no term won within 30s")
		}
		ctx := ctxT(t, time.Second)
		_ = e.waitFor(ctx, func() bool { return e.leading() != nil })
	}
}

// isVerdict: only the log's verdicts on the entry itself fail a step; a write whose
// outcome is unknown does not (TestLogOutageEndsTheEpochNotTheRun shows what follows).
func TestVerdictsAndUnknownOutcomes(t *testing.T) {
	for _, c := range []struct {
		err     error
		verdict bool
	}{
		{fmt.Errorf("x: %w", checkpoint.ErrConflict), true},
		{fmt.Errorf("x: %w", logstream.ErrOutputTooLarge), true},
		{fmt.Errorf("x: %w", checkpoint.ErrInvalidEntry), true},
		{&checkpoint.FencedError{}, false},
		{fmt.Errorf("x: %w", logstream.ErrAppendUncertain), false},
		{fmt.Errorf("checkpoint: await: %w", context.DeadlineExceeded), false},
		{logstream.ErrStopped, false},
		{fmt.Errorf("x: %w", checkpoint.ErrCorruptLog), false},
	} {
		if got := worker.IsVerdict(c.err); got != c.verdict {
			t.Errorf("worker.IsVerdict(%v) = %v, want %v", c.err, got, c.verdict)
		}
	}
}

// setLogSubject points the log's stream at subj: with any other subject than the log's,
// a publish finds no stream (a real outage of the log for writers; the stream and its
// consumers are untouched).
func setLogSubject(t *testing.T, e *Engine, subj string) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	s, err := e.js.Stream(ctx, logstream.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Subjects = []string{subj}
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// The log unavailable longer than a write's deadline (docs/failure-modes.md): the step's
// commit cannot be published and its outcome is unknown. The epoch ends as if its lease
// were lost (lock-stolen-mid-run); once the log is back the run is reclaimed, the step
// runs again and the run succeeds. It is never failed: an outage of the log must not look
// like the run's own failure. (With the outage taken for a verdict, the commit fails the
// step and the epoch is never stolen: the wait below runs out.)
func TestLogOutageEndsTheEpochNotTheRun(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var logs syncBuffer
	e := startEngine(t, func(c *Config) {
		c.Lease.TTL = 3 * time.Second // a lease lost to a loaded machine would end the epoch for another cause
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.Registry = steps.NewRegistry(0)
		_ = c.Registry.Register("gate", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
			if calls.Add(1) == 1 { // the first attempt waits for the outage to begin
				close(entered)
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return json.RawMessage(`{}`), nil
		}))
	})
	waitLeader(t, e)
	apply(t, e, "name: outage\nsteps:\n  - name: a\n    uses: noop\n  - name: b\n    needs: [a]\n    uses: gate\n")
	ctx := ctxT(t, 90*time.Second)
	id, err := e.StartRun(ctx, "outage", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("step b never started")
	}
	setLogSubject(t, e, port.LogSubject+".cut")
	cut := true
	heal := func() {
		if cut {
			cut = false
			setLogSubject(t, e, port.LogSubject)
		}
	}
	t.Cleanup(heal) // before the engine stops
	close(release)
	// The commit's publish is retried for the log's publish timeout, then given up.
	deadline := time.Now().Add(3 * logstream.DefaultPublishTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var stolen map[string]any
	for stolen == nil {
		if time.Now().After(deadline) {
			heal()
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			r, err := e.WaitRun(wctx, id)
			cancel()
			t.Fatalf("a commit of unknown outcome did not end its epoch within %s; the run then: %v %+v", 3*logstream.DefaultPublishTimeout, err, r)
		}
		<-tick.C // polling the engine's log, with a deadline
		for _, line := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == ReasonStolen {
				stolen = rec
			}
		}
	}
	if cause := fmt.Sprint(stolen["cause"]); !strings.Contains(cause, logstream.ErrAppendUncertain.Error()) {
		t.Fatalf("the epoch ended for another cause than the commit's unknown outcome: %s", cause)
	}
	heal()
	r, err := e.WaitRun(ctx, id)
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("after the outage: %v %+v; want the run resumed and succeeded", err, r)
	}
	v, err := e.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Epochs) < 2 || calls.Load() < 2 {
		t.Fatalf("epochs %+v, step b run %d times: want the step run again in a new epoch", r.Epochs, calls.Load())
	}
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindFail {
			t.Fatalf("the outage failed step %s: %+v", ev.Step, ev)
		}
	}
}

// ghostClaim makes a run look claimed by a worker holding no lease, as the leader sees a
// run claimed a moment ago whose lease its watcher has not caught up with; at is the
// claim's time by the writer's clock.
func ghostClaim(t *testing.T, e *Engine, id string, at time.Time) int64 {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	term := e.leading()
	if term == nil {
		t.Fatal("not leading")
	}
	sub := checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Owner: "test", At: at, Submit: &checkpoint.Submit{
		Workflow: "chain", Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: 5, Steps: []checkpoint.StepSpec{{Name: "s1"}}}}
	// One message, as the leader's StartRun does: the scheduler never sees it unassigned.
	f := e.clog.Writer.Write(ctx, sub, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: id, Term: term.Term(), Owner: "test", At: at})
	if err := f.Await(ctx); err != nil {
		t.Fatal(err)
	}
	ep := f.Seq()
	if err := e.clog.Writer.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: id, Epoch: int64(ep), Owner: "ghost", At: at}).Await(ctx); err != nil {
		t.Fatal(err)
	}
	return int64(ep)
}

func waitEpochChange(t *testing.T, e *Engine, id string, from int64) time.Duration {
	t.Helper()
	start := time.Now()
	ctx := ctxT(t, 20*time.Second)
	if err := e.waitFor(ctx, func() bool { r, err := e.store.Run(id); return err == nil && r.Epoch != from }); err != nil {
		t.Fatalf("run %s never reclaimed: %v", id, err)
	}
	return time.Since(start)
}

// Reconcile reclaims a running run without a live lease, but one the log changed less
// than a TTL ago only once it has gone without a lease for a TTL: the lease watcher may
// lag behind the log, and a reclaim costs a counted epoch change. A run quiet for longer
// is reclaimed at the next pass. (The decision at exact times is the leader's
// transcripts'; here the engine carries it out, on a 4 s TTL so that "at the next pass"
// and "after a TTL" are seconds apart.)
func TestReconcileWaitsOutAFreshClaim(t *testing.T) {
	lease := testLease
	lease.TTL = 4 * time.Second
	e := startEngine(t, func(c *Config) { c.ReconcileInterval = 50 * time.Millisecond; c.Workers = 1; c.Lease = lease })
	waitLeader(t, e)
	apply(t, e, workflow.ChainYAML("chain", 1))
	ttl := e.leases.Config().TTL

	ep := ghostClaim(t, e, "fresh", time.Now())
	if d := waitEpochChange(t, e, "fresh", ep); d < ttl*9/10 {
		t.Fatalf("a run claimed a moment ago was reclaimed after %s, before a lease TTL (%s) without a lease", d, ttl)
	}
	// Quiet for 3 TTLs by the log's clock: no grace, the next pass (50 ms) reclaims it.
	ep = ghostClaim(t, e, "quiet", time.Now().Add(-3*ttl))
	if d := waitEpochChange(t, e, "quiet", ep); d >= ttl/2 {
		t.Fatalf("a run quiet for 3 TTLs was reclaimed after %s; want the next reconcile pass, well within half a TTL (%s)", d, ttl/2)
	}
	for _, id := range []string{"fresh", "quiet"} {
		if r, _ := e.store.Run(id); r.Epochs[len(r.Epochs)-1].Reason != checkpoint.ReasonReconciled {
			t.Fatalf("%s: reclaimed with reason %q", id, r.Epochs[len(r.Epochs)-1].Reason)
		}
	}
}

// A node whose leases cannot renew (degraded: trouble reaching NATS) takes no new task; the
// run waits for it to recover (or for another node). With the guard off, the degraded
// node takes the run: the control shows the guard is what holds it back.
func TestDegradedNodeTakesNoNewWork(t *testing.T) {
	for _, guard := range []bool{true, false} {
		e := startEngine(t, nil)
		waitLeader(t, e)
		apply(t, e, workflow.ChainYAML("chain", 1))
		e.hooks.ForceDegraded.Store(true)
		ctx := ctxT(t, 30*time.Second)
		// A fetch already waiting when the node became degraded may still take a task:
		// on both sides, the run starts once the worker loop holds back (its fetch ends
		// within 2 s), and only then does the control switch the guard off, so that what
		// takes the run in the control is the switch, not a fetch left over.
		deadline := time.Now().Add(10 * time.Second)
		for !e.workers.HoldingBack() {
			if time.Now().After(deadline) {
				t.Fatal("the worker loop never held back")
			}
			wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			<-wctx.Done() // polling the worker loop's state, with a deadline
			cancel()
		}
		e.hooks.IgnoreDegraded.Store(!guard)
		id, err := e.StartRun(ctx, "chain", nil, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The same window on both sides: the control's node must take the run within it
		// (in well under a second when idle), the guarded node must not.
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = e.waitFor(wctx, func() bool { r, err := e.store.Run(id); return err == nil && r.Status != checkpoint.StatusPending })
		cancel()
		taken := err == nil
		if guard && taken {
			t.Fatal("a degraded node claimed a new run")
		}
		if !guard && !taken {
			t.Fatal("with the guard off the degraded node did not take the run: the control cannot see the guard")
		}
		e.hooks.ForceDegraded.Store(false)
		if r, err := e.WaitRun(ctx, id); err != nil || r.Status != checkpoint.StatusSucceeded {
			t.Fatalf("after recovery: %v %+v", err, r)
		}
	}
}

// The submit+assign path is only for run IDs StartRun made: a repeated given ID is
// refused as a submit, but an assign riding with it would give the existing run an epoch
// past its workflow's concurrency limit. With the path open to given IDs (control), the
// held-back run starts beside the one holding the limit.
func TestRepeatedRunIDCannotJumpTheConcurrencyLimit(t *testing.T) {
	for _, guard := range []bool{true, false} {
		e := startEngine(t, nil)
		waitLeader(t, e)
		e.hooks.FastPathGivenIDs.Store(!guard)
		apply(t, e, "name: limited\nconcurrency: 1\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
		apply(t, e, workflow.ChainYAML("free", 1))
		ctx := ctxT(t, 30*time.Second)
		for _, id := range []string{"holder", "held"} {
			if _, err := e.StartRun(ctx, "limited", nil, RunOptions{ID: id}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.waitFor(ctx, func() bool {
			r, err := e.store.Run("holder")
			return err == nil && r.Status == checkpoint.StatusRunning
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.StartRun(ctx, "free", nil, RunOptions{ID: "held"}); !errors.Is(err, checkpoint.ErrRunExists) {
			t.Fatalf("repeated ID: %v, want ErrRunExists", err)
		}
		r, err := e.store.Run("held")
		jumped := err == nil && r.Epoch != 0
		if guard && jumped {
			t.Fatalf("the run held back by the limit got epoch %d from a repeated ID", r.Epoch)
		}
		if !guard && !jumped {
			t.Fatal("with given IDs on the short path the held run kept no epoch: the control cannot see the damage")
		}
	}
}

// claims counts a run's accepted claim entries.
func claims(v *checkpoint.RunView) int {
	n := 0
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindClaim && ev.Outcome == "accepted" {
			n++
		}
	}
	return n
}

// A run started on the leader with a worker slot free is assigned to the leader's own
// worker in the submit's message: no task, no claim entry, the epoch owned from its
// first entry. With the path off (control) the same run goes through a task and a claim.
func TestLeaderRunsItsOwnRunWithoutATask(t *testing.T) {
	for _, own := range []bool{true, false} {
		e := startEngine(t, nil)
		waitLeader(t, e)
		e.hooks.NoOwnRuns.Store(!own)
		apply(t, e, workflow.ChainYAML("chain", 3))
		v := runToEnd(t, e, "chain", nil)
		if v.Run.Status != checkpoint.StatusSucceeded || len(v.Run.Epochs) != 1 || v.Run.Epochs[0].Owner != "node-a" || v.Run.EpochChanges != 0 {
			t.Fatalf("own=%v: run %s epochs %+v changes %d; want succeeded in one epoch owned by node-a", own, v.Run.Status, v.Run.Epochs, v.Run.EpochChanges)
		}
		if got, want := claims(v), map[bool]int{true: 0, false: 1}[own]; got != want {
			t.Fatalf("own=%v: %d claim entries, want %d", own, got, want)
		}
	}
}

// With no worker slot free, the leader does not take the run itself: it queues a task.
func TestLeaderWithoutAFreeSlotQueuesATask(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.Workers = 2 }) // the task loop holds one slot
	waitLeader(t, e)
	apply(t, e, "name: sleeper\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 1h}\n")
	apply(t, e, workflow.ChainYAML("chain", 2))
	ctx := ctxT(t, 30*time.Second)
	sleeper, err := e.StartRun(ctx, "sleeper", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Running means claimed: through a task that takes a claim entry, on the own-run path
	// none (the assign names the worker).
	if err := e.waitFor(ctx, func() bool {
		r, err := e.store.Run(sleeper)
		return err == nil && r.Status == checkpoint.StatusRunning
	}); err != nil {
		t.Fatalf("the first run never ran: %v", err)
	}
	if v, err := e.store.View(sleeper); err != nil {
		t.Fatal(err)
	} else if claims(v) != 0 || v.Run.Owner != "node-a" {
		t.Fatalf("the first run went through a task (%d claims, owner %q) although a slot was free", claims(v), v.Run.Owner)
	}
	v := runToEnd(t, e, "chain", nil)
	if v.Run.Status != checkpoint.StatusSucceeded || claims(v) != 1 {
		t.Fatalf("second run: %s with %d claims; want succeeded through a task (one claim)", v.Run.Status, claims(v))
	}
	if err := e.Cancel(ctx, sleeper, "test over"); err != nil {
		t.Fatal(err)
	}
}

// When the leader cannot take the lease of a run it assigned to itself, it hands the
// epoch back: not counted toward max_epochs, and the run finishes in the next epoch.
func TestOwnRunWithoutItsLeaseIsHandedBack(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	apply(t, e, workflow.ChainYAML("chain", 2))
	ctx := ctxT(t, 60*time.Second)
	squatter := startWithItsLeaseHeld(t, ctx, e, "chain", "r-held")
	if err := e.waitFor(ctx, func() bool {
		r, err := e.store.Run("r-held")
		return err == nil && len(r.Epochs) >= 2
	}); err != nil {
		t.Fatalf("no hand-back: %v", err)
	}
	_ = squatter.Release(ctx)
	r, err := e.WaitRun(ctx, "r-held")
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run after the hand-back: %v %+v", err, r)
	}
	if r.EpochChanges != 0 || r.Epochs[0].Owner != "node-a" || r.Epochs[1].Reason != checkpoint.ReasonReleased {
		t.Fatalf("epochs %+v, changes %d; want the first (node-a's) released, nothing counted", r.Epochs, r.EpochChanges)
	}
}

// A caller that gives up on StartRun (its ctx ended) does not strand a run the leader
// assigned to itself: the reserved worker follows the assign's outcome in the log, so
// the run finishes in its first epoch instead of waiting for a reclaim that would count
// toward max_epochs.
func TestOwnRunOutlivesItsCaller(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	apply(t, e, workflow.ChainYAML("chain", 2))
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := ctxT(t, 30*time.Second)
	for i := 0; i < 10; i++ {
		id, _ := e.StartRun(gone, "chain", nil, RunOptions{}) // may report the ctx's end
		r, err := e.WaitRun(ctx, id)
		if err != nil || r.Status != checkpoint.StatusSucceeded || r.EpochChanges != 0 || len(r.Epochs) != 1 {
			t.Fatalf("run %d after its caller left: %v %+v", i, err, r)
		}
	}
}

// A task whose run's lease someone else still holds (a zombie of an older epoch, here a
// squatter) is put back with a delay, not dropped: the run is taken as soon as the lease
// frees, in the same epoch. Dropped, it waited for the reconcile's re-queue, which the
// task stream's duplicate window swallows for a minute.
func TestTaskWithItsLeaseHeldIsRetried(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	e.hooks.NoOwnRuns.Store(true) // through a task
	apply(t, e, workflow.ChainYAML("chain", 2))
	ctx := ctxT(t, 30*time.Second)
	squatter := startWithItsLeaseHeld(t, ctx, e, "chain", "r-wait")
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for e.workers.Stats().TasksDeferred.Load() == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("the task never met the held lease")
		case <-tick.C:
		}
	}
	_ = squatter.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second) // well inside the duplicate window
	defer cancel()
	r, err := e.WaitRun(wctx, "r-wait")
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run after its lease freed: %v %+v", err, r)
	}
	if r.EpochChanges != 0 || len(r.Epochs) != 1 {
		t.Fatalf("epochs %+v, changes %d; want the first epoch to finish the run", r.Epochs, r.EpochChanges)
	}
}

// A claim whose write has an unknown outcome (NATS in trouble) puts its task back: if the
// claim did not land, the run is claimed again at once, in the same epoch. Acked away, the
// run waited for the reconcile's re-queue, which the task stream's duplicate window
// swallows for a minute.
func TestClaimOfUnknownOutcomeIsRetried(t *testing.T) {
	e := startEngine(t, nil)
	waitLeader(t, e)
	e.hooks.NoOwnRuns.Store(true) // through a task, so there is a claim
	apply(t, e, workflow.ChainYAML("chain", 2))
	e.hooks.LostClaims.Store(1)
	ctx := ctxT(t, 30*time.Second)
	id, err := e.StartRun(ctx, "chain", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second) // well inside the duplicate window
	defer cancel()
	r, err := e.WaitRun(wctx, id)
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run after a lost claim: %v %+v", err, r)
	}
	if e.hooks.LostClaims.Load() != 0 {
		t.Fatal("no claim was lost: the test did not test")
	}
	if r.EpochChanges != 0 || len(r.Epochs) != 1 {
		t.Fatalf("epochs %+v, changes %d; want the first epoch to finish the run", r.Epochs, r.EpochChanges)
	}
}

// startWithItsLeaseHeld starts a run of wf with ID id after a squatter (standing for a
// zombie of an older epoch) has taken the run's lease, and returns the squatter's lease.
func startWithItsLeaseHeld(t *testing.T, ctx context.Context, e *Engine, wf, id string) *epoch.Lease {
	t.Helper()
	e.hooks.FastPathGivenIDs.Store(true) // a given ID, so the lease can be held first
	squatter, err := e.leases.Acquire(ctx, id, 1<<40, "squatter")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.StartRun(ctx, wf, nil, RunOptions{ID: id}); err != nil {
		t.Fatal(err)
	}
	return squatter
}
