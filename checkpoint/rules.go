package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

func (tx *applyBatch) submit(idx int, e *Entry, sub *Submit) error {
	if c, err := tx.load(e.Run); err != nil {
		return err
	} else if c != nil {
		tx.event(c, idx, e, "rejected: run exists", "")
		return fmt.Errorf("%w: %s", ErrRunExists, e.Run)
	}
	maxEpochs := sub.MaxEpochs
	if maxEpochs == 0 {
		maxEpochs = DefaultMaxEpochs
	}
	r := &Run{
		ID: e.Run, Workflow: sub.Workflow, Version: sub.Version, Status: StatusPending,
		Trigger: sub.Trigger, ScheduledAt: sub.ScheduledAt, Inputs: sub.Inputs, Spec: sub.Spec,
		MaxEpochs: maxEpochs, Epochs: []EpochRecord{}, CreatedSeq: tx.seq, CreatedAt: e.At, UpdatedAt: e.At,
		StartedBy: e.Actor, Deadline: sub.Deadline, Handlers: sub.Handlers, Trace: sub.Trace, KeyScheme: sub.KeyScheme, Priority: sub.Priority,
	}
	if sub.Parent != nil {
		if err := tx.adopt(r, sub.Parent, e.Epoch, sub.MaxTree); err != nil {
			return err
		}
	}
	c := &cachedRun{run: r, steps: make(map[string]*Step, len(sub.Steps)), runDirty: true, dirtySteps: map[string]bool{}}
	for _, st := range sub.Steps {
		r.Steps = append(r.Steps, st.Name)
		c.steps[st.Name] = &Step{Name: st.Name, Foreach: st.Foreach, Status: StepPending}
		c.dirtySteps[st.Name] = true
	}
	tx.s.runs[e.Run] = c
	tx.use(c)
	tx.event(c, idx, e, "accepted", "")
	return nil
}

func (tx *applyBatch) cronTick(idx int, e *Entry) error {
	key := keyTick(e.Tick.Workflow, e.Tick.At)
	exists, err := tx.exists(key, &tx.ticks)
	if err != nil {
		return err
	}
	overwrite := false
	if exists && e.Tick.Outcome == TickBackfilled {
		// A backfill may run a tick that was recorded without a run (missed, paused,
		// skipped): the record becomes backfilled. One that ran stays as it was.
		var prev Tick
		if _, err := getJSON(tx.s.db, key, &prev); err != nil {
			return err
		}
		if !tx.ticks[string(key)] && !TickRan(prev.Outcome) {
			exists, overwrite = false, true
		}
	}
	if exists {
		return fmt.Errorf("%w: %s at %s", ErrTickExists, e.Tick.Workflow, e.Tick.At.Format(time.RFC3339))
	}
	if err := tx.putJSON(key, Tick{CronTick: *e.Tick, Scheduled: overwrite, Owner: e.Owner, Term: e.Term, Seq: tx.seq, Rec: e.At}); err != nil {
		return err
	}
	tx.mark(key, &tx.ticks)
	if TickRan(e.Tick.Outcome) {
		if overwrite {
			tx.tickDeadlineDone(e.Tick.Workflow, e.Tick.At)
		}
		return tx.submit(idx, e, e.Submit)
	}
	if !e.Tick.Deadline.IsZero() {
		_ = tx.b.Set(keyTickDeadline(e.Tick.Deadline, e.Tick.Workflow, e.Tick.At), nil, nil)
	}
	return nil
}

// workflow stores a new version of a workflow unless its digest equals the latest's.
func (tx *applyBatch) workflow(e *Entry) error {
	latest, err := latestWorkflow(tx.s.db, e.Workflow.Name)
	if err != nil {
		return err
	}
	if tx.workflows == nil {
		tx.workflows = map[string]*WorkflowVersion{}
	}
	if w, ok := tx.workflows[e.Workflow.Name]; ok {
		latest = w
	}
	if latest != nil && latest.Digest == e.Workflow.Digest {
		return nil // unchanged: same version
	}
	v := &WorkflowVersion{Name: e.Workflow.Name, Version: 1, Digest: e.Workflow.Digest, Spec: e.Workflow.Spec, Seq: tx.seq, At: e.At}
	if latest != nil {
		v.Version = latest.Version + 1
	}
	tx.workflows[v.Name] = v
	return tx.putJSON(keyWorkflow(v.Name, v.Version), v)
}

// reset returns every in-flight step to pending: a new epoch, a hand-back or a
// terminal status leaves nothing claiming to be in progress.
func (c *cachedRun) reset() {
	for _, name := range c.run.Steps {
		if st := c.steps[name]; st.Status == StepRunning {
			st.Status = StepPending
			c.dirtySteps[name] = true
		}
	}
}

// touch marks the run record changed.
func (c *cachedRun) touch(e *Entry) {
	c.runDirty = true
	c.run.UpdatedAt = e.At
}

func (tx *applyBatch) assign(c *cachedRun, e *Entry) error {
	r := c.run
	if r.Status != StatusPending && r.Status != StatusRunning {
		return tx.conflict(c, e, "only a pending or running run gets a new epoch (retry it first)")
	}
	if e.Epoch != r.Epoch {
		return tx.conflict(c, e, "the assigner saw epoch %d: its view is stale", e.Epoch)
	}
	if tx.assigned[r.ID] {
		return tx.conflict(c, e, "a second assign of the run in one log message")
	}
	counted := false
	var reason string
	switch {
	case r.Epoch == 0:
		reason = ReasonAssigned
	case r.RetryRequested:
		reason = ReasonRetried
	case r.Resume:
		reason = ReasonResumed // woke from a park: nobody lost ownership
	case r.HandedBack:
		reason = ReasonReleased
	case r.Owner != "":
		// Ownership was lost: the only epoch changes that count toward max_epochs.
		reason, counted = e.Reason, true
		if reason == "" {
			reason = ReasonLeaseExpired
		}
	default:
		// Assigned but never claimed (the task was lost): nobody lost ownership.
		reason = ReasonReconciled
	}
	c.touch(e)
	c.reset()
	if counted && r.EpochChanges+1 > r.MaxEpochs {
		r.Status = StatusDeadLettered
		r.Owner = ""
		r.DeadLetter = fmt.Sprintf("epoch changed %d times, more than max_epochs %d (last owner %s, %s)",
			r.EpochChanges+1, r.MaxEpochs, lastOwner(r), reason)
		return fmt.Errorf("%w: run %s: %s", ErrDeadLettered, r.ID, r.DeadLetter)
	}
	if counted {
		r.EpochChanges++
	}
	if tx.assigned == nil {
		tx.assigned = map[string]bool{}
	}
	tx.assigned[r.ID] = true
	r.Epoch = int64(tx.seq)
	r.Status = StatusPending
	r.Owner = ""
	r.HandedBack, r.RetryRequested, r.Resume = false, false, false
	r.Epochs = append(r.Epochs, EpochRecord{Epoch: r.Epoch, Reason: reason, At: e.At, Term: e.Term})
	if e.Worker != "" { // assigned and claimed at once
		r.Status = StatusRunning
		r.Owner = e.Worker
		r.Epochs[len(r.Epochs)-1].Owner = e.Worker
	}
	return nil
}

func lastOwner(r *Run) string {
	for i := len(r.Epochs) - 1; i >= 0; i-- {
		if r.Epochs[i].Owner != "" {
			return r.Epochs[i].Owner
		}
	}
	return "none"
}

func (tx *applyBatch) claim(c *cachedRun, e *Entry) error {
	r := c.run
	switch {
	case r.Status == StatusRunning && r.Epoch == e.Epoch && r.Owner == e.Owner:
		return nil // a repeated claim by the holder
	case e.Epoch != r.Epoch:
		return tx.fenced(c, e, "stale-epoch")
	case r.Status != StatusPending || r.Owner != "":
		return tx.fenced(c, e, "epoch-already-claimed")
	case claimedBefore(r) && !tx.s.hooks.NoClaimOnceCheck:
		// An epoch has one owner, ever: one handed back (requeue), or ended and then
		// retried, waits pending for its next assign, and a stale task of it must not
		// give it a second owner (whose writes its first owner's would pass as its own).
		return tx.fenced(c, e, "epoch-already-claimed")
	case (r.RetryRequested || r.HandedBack || r.Resume) && !tx.s.hooks.NoClaimOnceCheck:
		// Nor a first owner once the run has left the epoch: a run cancelled before its
		// epoch was claimed, then retried, waits at that epoch for its next assign, which
		// the leader writes without a lease to wait for. A late task's claim of the old
		// epoch would run it under an epoch that assign then replaces, the claimant still
		// holding its lease (the simulation's seed 1490: a side effect after the epoch
		// moved).
		return tx.fenced(c, e, "stale-epoch")
	}
	c.touch(e)
	r.Status = StatusRunning
	r.Owner = e.Owner
	r.Epochs[len(r.Epochs)-1].Owner = e.Owner
	if r.StartedAt.IsZero() {
		r.StartedAt = e.At
	}
	return nil
}

// claimedBefore reports whether the run's current epoch has had an owner.
func claimedBefore(r *Run) bool {
	n := len(r.Epochs)
	return n > 0 && r.Epochs[n-1].Epoch == r.Epoch && r.Epochs[n-1].Owner != ""
}

// guard is the fencing check shared by every write of a worker.
func (tx *applyBatch) guard(c *cachedRun, e *Entry) *FencedError {
	if c.run.Status != StatusRunning {
		return tx.fenced(c, e, "run-not-running")
	}
	if e.Epoch != c.run.Epoch && !tx.s.hooks.NoEpochCheck {
		if e.Epoch < c.run.Epoch {
			return tx.fenced(c, e, "stale-epoch")
		}
		return tx.fenced(c, e, "unknown-epoch")
	}
	return nil
}

func (tx *applyBatch) step(c *cachedRun, e *Entry) (*Step, error) {
	st, ok := c.steps[e.Step]
	if !ok {
		return nil, fmt.Errorf("%w: run %s has no step %q", ErrInvalidEntry, c.run.ID, e.Step)
	}
	return st, nil
}

func (tx *applyBatch) start(c *cachedRun, e *Entry) error {
	if f := tx.guard(c, e); f != nil {
		return f
	}
	st, err := tx.step(c, e)
	if err != nil {
		return err
	}
	// The start check. The engine does not wait for a start's outcome (that would cost
	// every step a log round trip), so it stops no side effect by itself; it keeps the
	// checkpoint check sound. A start accepted for a checkpointed step would set it
	// running again, and the checkpoint check, which reads that status, would then
	// accept a second commit of it: a start that slipped through (a zombie's, or a
	// forged one, within the current epoch) would undo invariant 1.
	// TestFencingGuardsAreNeeded ("no start check") shows that damage with the check off.
	switch st.Status {
	case StepSucceeded, StepSkipped:
		if !tx.s.hooks.NoStartCheck {
			return tx.fenced(c, e, "checkpoint-exists") // a checkpointed step never runs again
		}
	case StepFailed:
		return tx.conflict(c, e, "step %q already failed", st.Name)
	}
	c.dirtySteps[st.Name] = true
	st.Status = StepRunning
	st.Epoch = e.Epoch
	if st.StartedAt.IsZero() {
		st.StartedAt = e.At
	}
	st.Attempts = max(e.Attempt, st.Attempts+1)
	if st.Foreach && e.Items > 0 {
		st.Items = e.Items
	}
	return nil
}

func (tx *applyBatch) commitStep(c *cachedRun, idx int, e *Entry) error {
	if f := tx.guard(c, e); f != nil {
		return f
	}
	st, err := tx.step(c, e)
	if err != nil {
		return err
	}
	if e.Item != ItemWhole {
		if !st.Foreach {
			return fmt.Errorf("%w: step %q has no foreach: use item %d", ErrInvalidEntry, st.Name, ItemWhole)
		}
		if st.Items > 0 && e.Item >= st.Items {
			return fmt.Errorf("%w: step %q has %d items, item %d is out of range", ErrInvalidEntry, st.Name, st.Items, e.Item)
		}
	}
	exists, err := tx.checkpointed(c, st, e.Item)
	if err != nil {
		return err
	}
	if exists && !tx.s.hooks.NoCheckpointCheck {
		return tx.fenced(c, e, "checkpoint-exists")
	}
	if st.Status == StepFailed {
		return tx.conflict(c, e, "step %q already failed", st.Name)
	}
	c.dirtySteps[st.Name] = true
	if e.Kind == KindFail {
		st.Error = e.Error
		st.Attempts = max(st.Attempts, e.Attempt)
		st.Epoch = e.Epoch
		if e.Final {
			st.Status = StepFailed
			st.EndedAt = e.At
		}
		return nil
	}
	if e.Item != ItemWhole {
		st.ItemsDone++
		done, err := tx.doneItems(c, st.Name)
		if err != nil {
			return err
		}
		done[e.Item] = true
		return tx.putJSON(keyItem(c.run.ID, st.Name, e.Item), Item{
			Index: e.Item, Epoch: e.Epoch, Owner: e.Owner, Output: e.Output, Seq: tx.seq, Entry: idx, At: e.At,
		})
	}
	if e.Consume > 0 {
		if err := tx.consume(c, e); err != nil {
			return err
		}
	}
	st.Status = StepSucceeded
	st.Attempts = max(st.Attempts, e.Attempt)
	if e.Skipped {
		st.Status = StepSkipped
	}
	st.Output, st.Epoch, st.Seq, st.Error = e.Output, e.Epoch, tx.seq, ""
	st.EndedAt = e.At
	return nil
}

// checkpointed reports whether (step, item) has a checkpoint. A step's own checkpoint
// covers its items: once a foreach step is checkpointed as a whole, none of its items is
// written again. (Earlier an item's final failure was accepted after it, marked the
// step failed, and a retry then let a second commit of the step through: invariant 1,
// found by TestFencingInvariantsProperty.)
func (tx *applyBatch) checkpointed(c *cachedRun, st *Step, item int) (bool, error) {
	if st.Status == StepSucceeded || st.Status == StepSkipped {
		return true, nil
	}
	if item == ItemWhole {
		return false, nil
	}
	done, err := tx.doneItems(c, st.Name)
	if err != nil {
		return false, err
	}
	return done[item], nil
}

// doneItems is the set of a foreach step's checkpointed items, read from Pebble once
// per cached run and kept up to date by the applier.
func (tx *applyBatch) doneItems(c *cachedRun, step string) (map[int]bool, error) {
	if done, ok := c.items[step]; ok {
		return done, nil
	}
	done := map[int]bool{}
	err := scan(tx.s.db, prefixItems(c.run.ID, step), nil, func(k, _ []byte) (bool, error) {
		if len(k) < 8 {
			return false, fmt.Errorf("checkpoint: item key %q is corrupt", k)
		}
		done[int(binary.BigEndian.Uint64(k[len(k)-8:]))] = true
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	if c.items == nil {
		c.items = map[string]map[int]bool{}
	}
	c.items[step] = done
	return done, nil
}

// exists reports whether key is in Pebble or was written by this message.
func (tx *applyBatch) exists(key []byte, written *map[string]bool) (bool, error) {
	if (*written)[string(key)] {
		return true, nil
	}
	_, closer, err := tx.s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: read %q: %w: %w", key, ErrStorage, err)
	}
	closer.Close()
	return true, nil
}

func (tx *applyBatch) mark(key []byte, written *map[string]bool) {
	if *written == nil {
		*written = map[string]bool{}
	}
	(*written)[string(key)] = true
}

func (tx *applyBatch) complete(c *cachedRun, idx int, e *Entry) error {
	if f := tx.guard(c, e); f != nil {
		return f
	}
	r := c.run
	if e.Status == StatusSucceeded {
		for _, name := range r.Steps {
			if st := c.steps[name]; st.Status != StepSucceeded && st.Status != StepSkipped {
				return tx.conflict(c, e, "step %q is %s: a run succeeds only when every step has", name, st.Status)
			}
		}
	}
	c.touch(e)
	c.reset()
	r.Status = e.Status
	r.Error, r.FailedStep = e.Error, e.Step
	if e.Status == StatusSucceeded && len(e.Output) > 0 {
		r.Outputs = e.Output
	}
	return nil
}

func (tx *applyBatch) finishEarly(c *cachedRun, e *Entry, status RunStatus) error {
	r := c.run
	if r.Status.Terminal() {
		return tx.conflict(c, e, "the run already ended")
	}
	c.touch(e)
	c.reset()
	r.Status = status
	r.Owner = ""
	r.Waiting, r.Resume = nil, false
	if status == StatusDeadLettered {
		r.DeadLetter = e.Reason
	} else {
		r.Error = e.Reason
	}
	return nil
}

func (tx *applyBatch) requeue(c *cachedRun, e *Entry) error {
	if f := tx.guard(c, e); f != nil {
		return f
	}
	c.touch(e)
	c.reset()
	c.run.Status = StatusPending
	c.run.Owner = ""
	c.run.HandedBack = true
	return nil
}

// purge takes a dead-lettered run out of the DLQ: it ends cancelled, history kept.
func (tx *applyBatch) purge(c *cachedRun, e *Entry) error {
	if c.run.Status != StatusDeadLettered {
		return tx.conflict(c, e, "only a dead-lettered run can be purged")
	}
	c.touch(e)
	c.run.Status = StatusCancelled
	c.run.Error = "purged from the dead-letter queue: " + c.run.DeadLetter
	return nil
}

func (tx *applyBatch) retry(c *cachedRun, e *Entry) error {
	r := c.run
	ended := []RunStatus{StatusFailed, StatusDeadLettered, StatusCancelled}
	if len(e.Steps) > 0 {
		ended = append(ended, StatusSucceeded) // from a step: a succeeded run too
	}
	if !slices.Contains(ended, r.Status) {
		if len(e.Steps) > 0 {
			return tx.conflict(c, e, "only a run that ended can be retried from a step")
		}
		return tx.conflict(c, e, "only a failed, dead-lettered or cancelled run can be retried")
	}
	c.touch(e)
	c.reset()
	if len(e.Steps) > 0 {
		if err := tx.resetSteps(c, e); err != nil {
			return err
		}
		tx.detail = fmt.Sprintf("from step %s: %d step(s) reset", e.Steps[0], len(e.Steps))
		if len(e.Output) > 0 {
			tx.detail += ", inputs " + string(e.Output)
		}
	}
	if e.Reason != "" { // who asked, and as part of what (a bulk operation's name)
		tx.detail = strings.TrimPrefix(tx.detail+"; "+e.Reason, "; ")
	}
	for _, name := range r.Steps {
		if st := c.steps[name]; st.Status == StepFailed {
			st.Status, st.Error = StepPending, ""
			st.StartedAt, st.EndedAt = time.Time{}, time.Time{}
			c.dirtySteps[name] = true
			delete(r.Timers, name) // a retried wait waits again for its whole timeout
			// and a retried approval asks again: its decisions stay in the history only
			r.Decisions = slices.DeleteFunc(r.Decisions, func(d DecisionRecord) bool { return d.Step == name })
		}
	}
	r.Waiting, r.Resume = nil, false
	r.Status = StatusPending
	r.Owner = ""
	r.EpochChanges = 0
	r.RetryRequested, r.HandedBack = true, false
	r.Error, r.FailedStep, r.DeadLetter = "", "", ""
	return nil
}

// retire removes a run that ended (succeeded, failed or cancelled) with everything it
// holds: the leader writes it when the run's end is older than the retention. A
// dead-lettered run stays until purged; a run that has not ended is not retired.
func (tx *applyBatch) retire(c *cachedRun, e *Entry) error {
	switch c.run.Status {
	case StatusSucceeded, StatusFailed, StatusCancelled:
	default:
		return tx.conflict(c, e, "only a succeeded, failed or cancelled run is retired (a dead-lettered one stays until purged)")
	}
	c.retired = true
	return nil
}

// deleteRun deletes a retired run's record, steps, items, fenced commits, events and
// index entries, after everything else this message wrote about it. Keys are deleted one
// by one (the batch is indexed: it sees this message's own writes too): range deletions
// were measured to slow every later read of a replay fourfold. A failed read of what to
// delete is a storage failure (ErrStorage): deleting only what could be read would
// leave the run's keys on this node and not on the others. (Earlier the scans' errors
// were dropped, and TestFaultAtEveryOperation saw a retire leave events behind.)
func (tx *applyBatch) deleteRun(c *cachedRun) error {
	id := c.run.ID
	_ = tx.b.Delete(keyRun(id), nil)
	for _, name := range c.run.Steps {
		_ = tx.b.Delete(keyStep(id, name), nil)
	}
	var keys [][]byte // collected first: the batch is not changed while it is read
	for _, prefix := range [][]byte{[]byte("i/" + id + "/"), prefixFenced(id), prefixEvents(id)} {
		if err := scan(tx.b, prefix, nil, func(k, _ []byte) (bool, error) {
			keys = append(keys, slices.Clone(k))
			return true, nil
		}); err != nil {
			return err
		}
	}
	for _, k := range keys {
		_ = tx.b.Delete(k, nil)
	}
	if c.origDue != nil {
		_ = tx.b.Delete(c.origDue, nil)
	}
	for _, st := range []RunStatus{c.origStatus, c.run.Status} {
		if st != "" {
			_ = tx.b.Delete(keyByStatus(st, id), nil)
			_ = tx.b.Delete(keyByWorkflow(c.run.Workflow, st, id), nil)
		}
	}
	deleteNewest(tx.b, c.run)
	tx.s.counters.Retired.Add(1)
	return nil
}
