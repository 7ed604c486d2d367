package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// ErrDeadLettered is the outcome of an assign that would have changed the epoch more
// than max_epochs times: the run was dead-lettered instead and has no new epoch.
var ErrDeadLettered = errors.New("checkpoint: run dead-lettered (max_epochs exceeded)")

// applyBatch applies the entries of one log message into one Pebble batch. Runs and
// steps are read through the store's cache of decoded runs and written once at commit,
// so that several entries of one message about the same run see each other's effects.
type applyBatch struct {
	s     *Store
	b     *pebble.Batch
	seq   uint64
	term  int64
	order []*cachedRun // runs in first-touch order, so writes are deterministic
	// ticks and workflow versions written by this message (the batch is not indexed).
	ticks     map[string]bool
	workflows map[string]*WorkflowVersion
	// assigned holds runs given an epoch by this message: a second assign of the same
	// run in one message would get the same epoch, so it is rejected.
	assigned map[string]bool
}

// cachedRun is a decoded run and its steps. The applier is the only writer, so the
// cache (Store.runs) always holds what Pebble holds once a batch committed.
type cachedRun struct {
	run        *Run
	origStatus RunStatus // status in Pebble ("" for a new run)
	steps      map[string]*Step
	runDirty   bool
	dirtySteps map[string]bool
	items      map[string]map[int]bool // checkpointed foreach items, by step (loaded lazily)
	touched    uint64                  // the sequence of the message that last touched it
}

func newApplyBatch(s *Store, seq uint64) *applyBatch {
	return &applyBatch{s: s, b: s.db.NewBatch(), seq: seq, term: s.term.Load()}
}

func (tx *applyBatch) close() { _ = tx.b.Close() }

func (tx *applyBatch) commit() error {
	for _, c := range tx.order {
		id := c.run.ID
		if c.runDirty {
			c.run.UpdatedSeq = tx.seq
			if err := tx.putJSON(keyRun(id), c.run); err != nil {
				return err
			}
		}
		for _, name := range c.run.Steps {
			if c.dirtySteps[name] {
				if err := tx.putJSON(keyStep(id, name), c.steps[name]); err != nil {
					return err
				}
			}
		}
		if c.origStatus != c.run.Status {
			if c.origStatus != "" {
				_ = tx.b.Delete(keyByStatus(c.origStatus, id), nil)
				_ = tx.b.Delete(keyByWorkflow(c.run.Workflow, c.origStatus, id), nil)
			}
			_ = tx.b.Set(keyByStatus(c.run.Status, id), nil, nil)
			_ = tx.b.Set(keyByWorkflow(c.run.Workflow, c.run.Status, id), nil, nil)
		}
	}
	_ = tx.b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, tx.seq), nil)
	_ = tx.b.Set(keyTerm, binary.BigEndian.AppendUint64(nil, uint64(tx.term)), nil)
	// NoSync: the log is the durable record. A crash that loses this batch replays it,
	// since the applied sequence is in the same batch.
	if err := tx.b.Commit(pebble.NoSync); err != nil {
		tx.s.dropCache() // the cache may hold this batch's changes
		return fmt.Errorf("checkpoint: commit state for sequence %d: %w", tx.seq, err)
	}
	for name, v := range tx.workflows {
		tx.s.latest.Store(name, v)
	}
	if len(tx.workflows) > 0 || len(tx.ticks) > 0 {
		tx.s.scheduleChanged()
	}
	for _, c := range tx.order {
		tx.s.noteQueue(c.run)
		if c.origStatus != c.run.Status && tx.s.onStatus != nil {
			tx.s.onStatus(c.run.ID, c.run.Status)
		}
		c.origStatus, c.runDirty = c.run.Status, false
		clear(c.dirtySteps)
	}
	tx.s.trimCache()
	return nil
}

func (tx *applyBatch) putJSON(key []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("checkpoint: encode %q: %w", key, err)
	}
	return tx.b.Set(key, raw, nil)
}

// load returns the run, or nil if it does not exist.
func (tx *applyBatch) load(id string) (*cachedRun, error) {
	c, ok := tx.s.runs[id]
	if !ok {
		var r Run
		found, err := getJSON(tx.s.db, keyRun(id), &r)
		if err != nil || !found {
			return nil, err
		}
		c = &cachedRun{run: &r, origStatus: r.Status, steps: make(map[string]*Step, len(r.Steps)), dirtySteps: map[string]bool{}}
		for _, name := range r.Steps {
			var st Step
			if _, err := getJSON(tx.s.db, keyStep(id, name), &st); err != nil {
				return nil, err
			}
			c.steps[name] = &st
		}
		tx.s.runs[id] = c
	}
	tx.use(c)
	return c, nil
}

func (tx *applyBatch) use(c *cachedRun) {
	if c.touched != tx.seq {
		c.touched = tx.seq
		tx.order = append(tx.order, c)
	}
}

func (tx *applyBatch) judge(idx int, e *Entry) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w (sequence %d, entry %d)", err, tx.seq, idx)
	}
	if e.Term > 0 {
		if e.Term < tx.term && !tx.s.unsafe.NoTermCheck {
			rej := &StaleTermError{Kind: e.Kind, Run: e.Run, Term: e.Term, HighestTerm: tx.term, Seq: tx.seq}
			tx.s.counters.StaleTerms.Add(1)
			_ = tx.putJSON(keyStaleTerm(tx.seq, idx), StaleTerm{Kind: e.Kind, Run: e.Run, Term: e.Term, HighestTerm: tx.term, Seq: tx.seq, At: e.At})
			if c, _ := tx.load(e.Run); c != nil {
				tx.event(c, idx, e, "rejected: stale term", fmt.Sprintf("term %d < %d", e.Term, tx.term))
			}
			return rej
		}
		tx.term = max(tx.term, e.Term)
	}
	switch e.Kind {
	case KindSubmit:
		return tx.submit(idx, e, e.Submit)
	case KindCronTick:
		return tx.cronTick(idx, e)
	case KindWorkflow:
		return tx.workflow(e)
	}
	c, err := tx.load(e.Run)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("%w: run %q (%s at sequence %d)", ErrNotFound, e.Run, e.Kind, tx.seq)
	}
	switch e.Kind {
	case KindAssign:
		err = tx.assign(c, e)
	case KindClaim:
		err = tx.claim(c, e)
	case KindStart:
		err = tx.start(c, e)
	case KindCommit, KindFail:
		err = tx.commitStep(c, idx, e)
	case KindComplete:
		err = tx.complete(c, idx, e)
	case KindCancel:
		err = tx.finishEarly(c, e, StatusCancelled)
	case KindDeadLetter:
		err = tx.finishEarly(c, e, StatusDeadLettered)
	case KindRequeue:
		err = tx.requeue(c, e)
	case KindRetry:
		err = tx.retry(c, e)
	case KindPurge:
		err = tx.purge(c, e)
	}
	var fe *FencedError
	switch {
	case err == nil:
		switch e.Kind {
		case KindCommit:
			tx.s.counters.CommitsAccepted.Add(1)
		case KindAssign:
			tx.s.counters.EpochChanges.Add(1)
		case KindDeadLetter:
			tx.s.counters.DeadLettered.Add(1)
		}
		// An accepted item commit is its own history: the Item record carries its
		// sequence, and View merges items into the events (one write less per item).
		if e.Kind != KindCommit || e.Item == ItemWhole {
			tx.event(c, idx, e, "accepted", acceptedDetail(c, e))
		}
	case errors.As(err, &fe):
		tx.event(c, idx, e, "fenced: "+fe.Reason, "")
		if e.Kind == KindCommit || e.Kind == KindFail || e.Kind == KindComplete {
			tx.s.counters.CommitsFenced.Add(1)
			c.run.Fenced++
			c.runDirty = true
			_ = tx.putJSON(keyFenced(c.run.ID, tx.seq, idx), Fenced{
				Step: e.Step, Item: e.Item, Epoch: e.Epoch, CurrentEpoch: fe.CurrentEpoch,
				Owner: e.Owner, Kind: e.Kind, Reason: fe.Reason, Seq: tx.seq, At: e.At,
			})
		}
	case errors.Is(err, ErrDeadLettered):
		tx.s.counters.DeadLettered.Add(1)
		tx.event(c, idx, e, "dead-lettered", c.run.DeadLetter)
	default:
		tx.event(c, idx, e, "rejected", err.Error())
	}
	return err
}

func (tx *applyBatch) event(c *cachedRun, idx int, e *Entry, outcome, detail string) {
	_ = tx.putJSON(keyEvent(c.run.ID, tx.seq, idx), Event{
		Seq: tx.seq, Index: idx, Kind: e.Kind, Epoch: e.Epoch, Term: e.Term, Owner: e.Owner,
		Step: e.Step, Item: e.Item, Outcome: outcome, Detail: detail, At: e.At,
	})
}

// acceptedDetail is what the history says of an accepted entry beyond "accepted": the
// item count of a foreach step's start, so that a step that ran over an empty list reads
// "0 items" rather than looking like it did nothing by mistake.
func acceptedDetail(c *cachedRun, e *Entry) string {
	if e.Kind == KindStart && e.Item == ItemWhole {
		if st := c.steps[e.Step]; st != nil && st.Foreach {
			return fmt.Sprintf("%d items", e.Items)
		}
	}
	return ""
}

func (tx *applyBatch) fenced(c *cachedRun, e *Entry, reason string) *FencedError {
	return &FencedError{Run: c.run.ID, Step: e.Step, Item: e.Item, Epoch: e.Epoch,
		CurrentEpoch: c.run.Epoch, Reason: reason, Seq: tx.seq}
}

func (tx *applyBatch) conflict(c *cachedRun, e *Entry, format string, args ...any) error {
	return fmt.Errorf("%w: %s of run %s (status %s, epoch %d): %s", ErrConflict, e.Kind,
		c.run.ID, c.run.Status, c.run.Epoch, fmt.Sprintf(format, args...))
}

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
	if exists {
		return fmt.Errorf("%w: %s at %s", ErrTickExists, e.Tick.Workflow, e.Tick.At.Format(time.RFC3339))
	}
	if err := tx.putJSON(key, Tick{CronTick: *e.Tick, Owner: e.Owner, Term: e.Term, Seq: tx.seq, Rec: e.At}); err != nil {
		return err
	}
	tx.mark(key, &tx.ticks)
	if e.Tick.Outcome == TickFired || e.Tick.Outcome == TickCaughtUp {
		return tx.submit(idx, e, e.Submit)
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
	r.HandedBack, r.RetryRequested = false, false
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
	}
	c.touch(e)
	r.Status = StatusRunning
	r.Owner = e.Owner
	r.Epochs[len(r.Epochs)-1].Owner = e.Owner
	return nil
}

// guard is the fencing check shared by every write of a worker.
func (tx *applyBatch) guard(c *cachedRun, e *Entry) *FencedError {
	if c.run.Status != StatusRunning {
		return tx.fenced(c, e, "run-not-running")
	}
	if e.Epoch != c.run.Epoch && !tx.s.unsafe.NoEpochCheck {
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
		if !tx.s.unsafe.NoStartCheck {
			return tx.fenced(c, e, "checkpoint-exists") // a checkpointed step never runs again
		}
	case StepFailed:
		return tx.conflict(c, e, "step %q already failed", st.Name)
	}
	c.dirtySteps[st.Name] = true
	st.Status = StepRunning
	st.Epoch = e.Epoch
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
	if exists && !tx.s.unsafe.NoCheckpointCheck {
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
	st.Status = StepSucceeded
	st.Attempts = max(st.Attempts, e.Attempt)
	if e.Skipped {
		st.Status = StepSkipped
	}
	st.Output, st.Epoch, st.Seq, st.Error = e.Output, e.Epoch, tx.seq, ""
	return nil
}

func (tx *applyBatch) checkpointed(c *cachedRun, st *Step, item int) (bool, error) {
	if item == ItemWhole {
		return st.Status == StepSucceeded || st.Status == StepSkipped, nil
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
		return false, fmt.Errorf("checkpoint: read %q: %w", key, err)
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
	if !slices.Contains([]RunStatus{StatusFailed, StatusDeadLettered, StatusCancelled}, r.Status) {
		return tx.conflict(c, e, "only a failed, dead-lettered or cancelled run can be retried")
	}
	c.touch(e)
	c.reset()
	for _, name := range r.Steps {
		if st := c.steps[name]; st.Status == StepFailed {
			st.Status, st.Error = StepPending, ""
			c.dirtySteps[name] = true
		}
	}
	r.Status = StatusPending
	r.Owner = ""
	r.EpochChanges = 0
	r.RetryRequested, r.HandedBack = true, false
	r.Error, r.FailedStep, r.DeadLetter = "", "", ""
	return nil
}
