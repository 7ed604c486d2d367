package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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
	// detail is what the history says of the entry being judged, set by its rule ("" for
	// acceptedDetail's default).
	detail string
	// schedules changed by this message (operations.go); scheduleMoved wakes cron.
	schedules     map[string]*ScheduleState
	scheduleMoved bool
	// clusterVersion is the version a cluster_version entry of this message raised the
	// cluster to (0: none did).
	clusterVersion int
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
	retired    bool                    // a retire entry of this message removes it at commit
	origAlarm  []byte                  // its key in the timer index in Pebble (wait.go), nil if none
	origDue    []byte                  // its key in the deadline index in Pebble (operations.go), nil if none
}

// newApplyBatch starts the batch of message seq. indexed makes it a batch that reads its
// own writes (Pebble's indexed batch), which a retire needs to find every key of its run;
// the others do without its cost.
func newApplyBatch(s *Store, seq uint64, indexed bool) *applyBatch {
	b := s.db.NewBatch()
	if indexed {
		b = s.db.NewIndexedBatch()
	}
	return &applyBatch{s: s, b: b, seq: seq, term: s.term.Load()}
}

func (tx *applyBatch) close() { _ = tx.b.Close() }

func (tx *applyBatch) commit() error {
	for _, c := range tx.order {
		id := c.run.ID
		if c.retired {
			if err := tx.deleteRun(c); err != nil {
				tx.s.dropCache() // the cache holds this message's changes
				return fmt.Errorf("checkpoint: retire run %s at sequence %d: %w", id, tx.seq, err)
			}
			continue
		}
		if c.origStatus != c.run.Status && c.origStatus != "" {
			// The run's end is the time of the entry that ended it (touch set UpdatedAt).
			c.run.EndedAt = time.Time{}
			if c.run.Status.Terminal() {
				c.run.EndedAt = c.run.UpdatedAt
			}
		}
		c.drainEnded(tx.s.hooks.NoStepDrain)
		if c.runDirty {
			c.run.UpdatedSeq = tx.seq
			if err := tx.putJSON(keyRun(id), c.run); err != nil {
				return err
			}
		}
		tx.setAlarm(c)
		if due := deadlineKey(c.run); !bytes.Equal(due, c.origDue) {
			if c.origDue != nil {
				_ = tx.b.Delete(c.origDue, nil)
			}
			if due != nil {
				_ = tx.b.Set(due, nil, nil)
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
			} else {
				setNewestCreated(tx.b, c.run) // a new run (submit, or a tick that fired)
			}
			_ = tx.b.Set(keyByStatus(c.run.Status, id), nil, nil)
			_ = tx.b.Set(keyByWorkflow(c.run.Workflow, c.run.Status, id), nil, nil)
		}
	}
	_ = tx.b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, tx.seq), nil)
	// The newest-first indexes are current at this sequence too (newest.go).
	_ = tx.b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, tx.seq), nil)
	_ = tx.b.Set(keyTerm, binary.BigEndian.AppendUint64(nil, uint64(tx.term)), nil)
	if tx.clusterVersion > 0 {
		_ = tx.b.Set(keyClusterVersion, binary.BigEndian.AppendUint64(nil, uint64(tx.clusterVersion)), nil)
	}
	// NoSync: the log is the durable record. A crash that loses this batch replays it,
	// since the applied sequence is in the same batch.
	if err := tx.b.Commit(pebble.NoSync); err != nil {
		tx.s.dropCache() // the cache may hold this batch's changes
		return fmt.Errorf("checkpoint: commit state for sequence %d: %w", tx.seq, err)
	}
	for name, v := range tx.workflows {
		tx.s.latest.Store(name, v)
	}
	if len(tx.workflows) > 0 || len(tx.ticks) > 0 || tx.scheduleMoved {
		tx.s.scheduleChanged()
	}
	for _, c := range tx.order {
		if c.retired {
			delete(tx.s.runs, c.run.ID)
			// One message may end a run and retire it (a cancel and the leader's retire
			// packed together): the queue and the status hook hear of its end all the
			// same. Its status is terminal (only an ended run is retired), so it leaves
			// the admission queue and the held count, and a worker executing it stops.
			// (Earlier a run retired in the message that ended it stayed queued or held
			// until the node restarted.)
			tx.s.noteQueue(c.run)
			if c.origStatus != c.run.Status && tx.s.onStatus != nil {
				tx.s.onStatus(c.run.ID, c.run.Status)
			}
			continue
		}
		tx.s.noteQueue(c.run)
		if c.origStatus != c.run.Status && tx.s.onStatus != nil {
			tx.s.onStatus(c.run.ID, c.run.Status)
		}
		c.origStatus, c.runDirty = c.run.Status, false
		c.origAlarm, c.origDue = alarmKey(c.run), deadlineKey(c.run)
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
	if ok && c.retired {
		return nil, nil // retired by an earlier entry of this message
	}
	if !ok {
		var r Run
		found, err := getJSON(tx.s.db, keyRun(id), &r)
		if err != nil || !found {
			return nil, err
		}
		c = &cachedRun{run: &r, origStatus: r.Status, steps: make(map[string]*Step, len(r.Steps)), dirtySteps: map[string]bool{}, origAlarm: alarmKey(&r), origDue: deadlineKey(&r)}
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
		if e.Term < tx.term && !tx.s.hooks.NoTermCheck {
			rej := &StaleTermError{Kind: e.Kind, Run: e.Run, Term: e.Term, HighestTerm: tx.term, Seq: tx.seq}
			tx.s.counters.StaleTerms.Add(1)
			_ = tx.putJSON(keyStaleTerm(tx.seq, idx), StaleTerm{Kind: e.Kind, Run: e.Run, Term: e.Term, HighestTerm: tx.term, Seq: tx.seq, At: e.At})
			// A failed read of the run is a storage failure, not a rejection without its
			// event (the other nodes record it).
			c, err := tx.load(e.Run)
			if err != nil {
				return err
			}
			if c != nil {
				tx.event(c, idx, e, "rejected: stale term", fmt.Sprintf("term %d < %d", e.Term, tx.term))
			}
			return rej
		}
	}
	if tx.s.hooks.TermFromAnyEntry && e.Term > 0 {
		tx.term = max(tx.term, e.Term) // the guard's negative control: before the entry is judged
	}
	err := tx.judgeKind(idx, e)
	if err == nil && e.Term > 0 {
		// Only an accepted entry raises the term: one rejected for anything else (a
		// forged or confused entry with a huge term) must not make every later entry of
		// the real leader stale.
		tx.term = max(tx.term, e.Term)
	}
	return err
}

// judgeKind judges an entry that passed the term check by the rules of its kind.
func (tx *applyBatch) judgeKind(idx int, e *Entry) error {
	switch e.Kind {
	case KindSubmit:
		return tx.submit(idx, e, e.Submit)
	case KindCronTick:
		return tx.cronTick(idx, e)
	case KindWorkflow:
		return tx.workflow(e)
	case KindCronPause, KindCronResume:
		return tx.schedule(e)
	case KindDeadlineMissed:
		if e.Run == "" {
			return tx.tickDeadlineMissed(e)
		}
	case KindClusterVersion:
		return tx.raiseClusterVersion(e)
	}
	c, err := tx.load(e.Run)
	if err != nil {
		return err
	}
	if c == nil {
		return fmt.Errorf("%w: run %q (%s at sequence %d)", ErrNotFound, e.Run, e.Kind, tx.seq)
	}
	tx.detail = ""
	wasTerminal := c.run.Status.Terminal()
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
		if err = tx.finishEarly(c, e, StatusCancelled); err == nil && !tx.s.hooks.NoCancelCascade {
			err = tx.cancelChildren(c, idx, e)
		}
	case KindDeadLetter:
		err = tx.finishEarly(c, e, StatusDeadLettered)
	case KindRequeue:
		err = tx.requeue(c, e)
	case KindRetry:
		err = tx.retry(c, e)
	case KindPurge:
		err = tx.purge(c, e)
	case KindRetire:
		err = tx.retire(c, e)
	case KindSignal:
		err = tx.signal(c, e)
	case KindDecide:
		err = tx.decide(c, e)
	case KindPark:
		err = tx.park(c, e)
	case KindWake:
		err = tx.wake(c, e)
	case KindDeadlineMissed:
		err = tx.deadlineMissed(c, e)
	}
	if (err == nil || errors.Is(err, ErrDeadLettered)) && !wasTerminal && c.run.Status.Terminal() && c.run.Parent != nil {
		if perr := tx.childEnded(c, idx, e); perr != nil {
			return perr
		}
	}
	if (err == nil || errors.Is(err, ErrDeadLettered)) && (!wasTerminal || tx.s.hooks.NoHandlerOnce) && len(c.run.Handlers) > 0 {
		var event string
		switch c.run.Status {
		case StatusFailed:
			event = OnFailureEvent
		case StatusDeadLettered:
			event = OnDeadLetterEvent
		}
		if event != "" {
			if herr := tx.startHandler(c, idx, e, event); herr != nil {
				return herr
			}
		}
	}
	if err == nil && e.Kind == KindDeadlineMissed && len(c.run.Handlers) > 0 {
		if herr := tx.startHandler(c, idx, e, OnDeadlineEvent); herr != nil {
			return herr
		}
	}
	if err == nil {
		tx.settleSlots(c, e)
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
			detail := acceptedDetail(c, e)
			if tx.detail != "" {
				detail = tx.detail
			}
			tx.event(c, idx, e, "accepted", detail)
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
		detail := c.run.DeadLetter
		if tx.detail != "" {
			detail += "; " + tx.detail
		}
		tx.event(c, idx, e, "dead-lettered", detail)
	default:
		tx.event(c, idx, e, "rejected", err.Error())
	}
	return err
}

func (tx *applyBatch) event(c *cachedRun, idx int, e *Entry, outcome, detail string) {
	_ = tx.putJSON(keyEvent(c.run.ID, tx.seq, idx), Event{
		Seq: tx.seq, Index: idx, Kind: e.Kind, Epoch: e.Epoch, Term: e.Term, Owner: e.Owner, Actor: e.Actor,
		Step: e.Step, Item: e.Item, Outcome: outcome, Detail: detail, At: e.At, Steps: e.Steps,
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
