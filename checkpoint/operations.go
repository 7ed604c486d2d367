package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/flowrun/flow/internal/base/ident"
)

// Nightly operations: an operator pauses and resumes a schedule, and retries
// a run from a step.
//
// A pause is a cron_pause entry with the actor and a reason: the schedule's state says
// it is paused, and the leader fires none of its ticks while it is (engine/internal/
// leader/cron.go); on resume, the ticks that came due meanwhile are looked at as after an
// outage, by the schedule's catchup, and those that do not fire are recorded as paused.
//
// A retry from a step (retry with Steps, format 3) resets the steps it names (the step
// and every step that depends on it: the engine computes them from the workflow) to
// pending, deletes their item checkpoints, and gives the run a new epoch (reason
// retried, not counted); their earlier commits stay in the history. Fencing: the reset
// is not a worker's write, and it changes nothing of an epoch's: the run's next epoch is
// a new one, so a commit of the old epoch is stale (the guard), and the new epoch's
// first commit of a reset step is the only one of that (step, item, epoch).

// Entry kinds of nightly operations (format 3).
const (
	KindCronPause  Kind = "cron_pause"  // an operator pauses a schedule
	KindCronResume Kind = "cron_resume" // an operator resumes it
)

// Tick outcomes of nightly operations (format 3). TickPaused: a fire time that came
// while the schedule was paused and did not fire. TickBackfilled: a fire time an
// operator's backfill ran (a run with the tick's own run ID, so never a second run of a
// tick).
const (
	TickPaused     = "paused"
	TickBackfilled = "backfilled"
)

// TickRan reports whether a tick's outcome has a run.
func TickRan(outcome string) bool {
	return outcome == TickFired || outcome == TickCaughtUp || outcome == TickBackfilled
}

// ScheduleChange is a cron_pause or cron_resume entry's content.
type ScheduleChange struct {
	Workflow string `json:"workflow"`
	Reason   string `json:"reason,omitempty"`
}

// ScheduleState is a schedule's pause, as the log has it.
type ScheduleState struct {
	Workflow  string    `json:"workflow"`
	Paused    bool      `json:"paused"`
	Reason    string    `json:"reason,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	Since     time.Time `json:"since"`                // the last pause's time (its writer's clock)
	Resumed   time.Time `json:"resumed,omitzero"`     // the last resume's
	Seq       uint64    `json:"seq"`                  // the entry that set it
	ResumedBy string    `json:"resumed_by,omitempty"` // the actor of the last resume
}

func keySchedule(workflow string) []byte { return []byte("k/" + workflow) }

// PausedInterval reports whether a tick at t came while the schedule was paused: after
// its last pause and before its resume (or now, while paused).
func (s *ScheduleState) PausedInterval(t time.Time) bool {
	if s == nil || s.Since.IsZero() || t.Before(s.Since) {
		return false
	}
	return s.Paused || !t.After(s.Resumed)
}

func (e *Entry) validateSchedule(bad func(string, ...any) error) error {
	if e.Schedule == nil || !ident.ValidName(e.Schedule.Workflow) {
		return bad("a schedule change names its workflow")
	}
	if len(e.Schedule.Reason) > MaxCommentSize || !printable(e.Schedule.Reason) {
		return bad("reason: at most %d printable characters", MaxCommentSize)
	}
	return nil
}

func (tx *applyBatch) schedule(e *Entry) error {
	name := e.Schedule.Workflow
	latest, err := latestWorkflow(tx.s.db, name)
	if err != nil {
		return err
	}
	if w, ok := tx.workflows[name]; ok {
		latest = w
	}
	if latest == nil {
		return fmt.Errorf("%w: workflow %q", ErrNotFound, name)
	}
	var spec struct {
		Schedule *json.RawMessage `json:"schedule"`
	}
	if json.Unmarshal(latest.Spec, &spec) != nil || spec.Schedule == nil {
		return fmt.Errorf("%w: workflow %s has no schedule", ErrConflict, name)
	}
	st, err := tx.scheduleState(name)
	if err != nil {
		return err
	}
	if e.Kind == KindCronResume {
		if !st.Paused {
			return fmt.Errorf("%w: the schedule of %s is not paused", ErrConflict, name)
		}
		st.Paused, st.Resumed, st.ResumedBy = false, e.At, e.Actor
	} else {
		if !st.Paused {
			st.Since = e.At
		}
		st.Paused, st.Reason, st.Actor = true, e.Schedule.Reason, e.Actor
	}
	st.Seq = tx.seq
	if tx.schedules == nil {
		tx.schedules = map[string]*ScheduleState{}
	}
	tx.schedules[name] = st
	tx.scheduleMoved = true
	return tx.putJSON(keySchedule(name), st)
}

// scheduleState is the schedule's state as this message has it (a new one if none).
func (tx *applyBatch) scheduleState(name string) (*ScheduleState, error) {
	if st, ok := tx.schedules[name]; ok {
		return st, nil
	}
	st := &ScheduleState{Workflow: name}
	if _, err := getJSON(tx.s.db, keySchedule(name), st); err != nil {
		return nil, err
	}
	return st, nil
}

// Schedule is a workflow's schedule state (nil: never paused).
func (s *Store) Schedule(workflow string) (*ScheduleState, error) {
	var st ScheduleState
	found, err := getJSON(s.db, keySchedule(workflow), &st)
	if err != nil || !found {
		return nil, err
	}
	return &st, nil
}

// resetSteps is a retry's reset of the steps it names (retry --from): each goes back to
// pending, its item checkpoints deleted (they stay in the history), its wait state
// (timer, decisions) cleared.
func (tx *applyBatch) resetSteps(c *cachedRun, e *Entry) error {
	r := c.run
	for _, name := range e.Steps {
		st, ok := c.steps[name]
		if !ok {
			return fmt.Errorf("%w: run %s has no step %q", ErrInvalidEntry, r.ID, name)
		}
		if st.Foreach {
			// An item's checkpoint is its own history (View merges it into the events):
			// deleted, it becomes an event of its own, so the history keeps it.
			var keys [][]byte
			var items []Item
			if err := scan(tx.s.db, prefixItems(r.ID, name), nil, func(k, v []byte) (bool, error) {
				var it Item
				if err := json.Unmarshal(v, &it); err != nil {
					return false, fmt.Errorf("checkpoint: item %q is corrupt: %w", k, err)
				}
				keys, items = append(keys, slices.Clone(k)), append(items, it)
				return true, nil
			}); err != nil && !errors.Is(err, pebble.ErrNotFound) {
				return err
			}
			for i, k := range keys {
				it := items[i]
				_ = tx.b.Delete(k, nil)
				_ = tx.putJSON(keyEvent(r.ID, it.Seq, it.Entry), Event{Seq: it.Seq, Index: it.Entry, Kind: KindCommit, Epoch: it.Epoch,
					Owner: it.Owner, Step: name, Item: it.Index, Outcome: "accepted", At: it.At})
			}
			delete(c.items, name)
		}
		st.Status, st.Output, st.Error, st.Seq = StepPending, nil, "", 0
		st.StartedAt, st.EndedAt = time.Time{}, time.Time{}
		st.Items, st.ItemsDone, st.Attempts = 0, 0, 0
		c.dirtySteps[name] = true
		delete(r.Timers, name)
		r.Decisions = slices.DeleteFunc(r.Decisions, func(d DecisionRecord) bool { return d.Step == name })
	}
	r.Outputs = nil
	if len(e.Output) > 0 && e.Actor != "" && !slices.Contains(r.InputsBy, e.Actor) {
		r.InputsBy = append(r.InputsBy, e.Actor) // who set what the run's approvals are about
	}
	if len(e.Output) > 0 { // changed inputs, merged over the run's
		merged := map[string]json.RawMessage{}
		_ = json.Unmarshal(r.Inputs, &merged)
		var changes map[string]json.RawMessage
		if err := json.Unmarshal(e.Output, &changes); err != nil {
			return fmt.Errorf("%w: inputs: %v", ErrInvalidEntry, err)
		}
		for k, v := range changes {
			merged[k] = v
		}
		r.Inputs, _ = json.Marshal(merged)
	}
	return nil
}

// Deadlines: a run whose workflow has a deadline carries it from its submit
// (Run.Deadline). The leader writes deadline-missed for a run that has not succeeded by
// then (a scheduler entry, with the term: a deposed leader's is refused; the run is
// marked once, so two leaders' passes mark it once). An index of runs by deadline
// (l/<deadline><run>) keeps the pass to the due ones.

// KindDeadlineMissed marks a run that had not succeeded by its deadline (scheduler;
// format 3). Its name is the history's event (public contract).
const KindDeadlineMissed Kind = "deadline-missed"

func keyDeadline(at time.Time, run string) []byte {
	return append(binary.BigEndian.AppendUint64([]byte("l/"), uint64(at.UnixNano())), run...)
}

var prefixDeadlines = []byte("l/")

// deadlineKey is the run's key in the deadline index: nil once it succeeded or its miss
// was recorded, or without a deadline.
func deadlineKey(r *Run) []byte {
	if r == nil || r.Deadline.IsZero() || r.DeadlineMissed || r.Status == StatusSucceeded {
		return nil
	}
	return keyDeadline(r.Deadline, r.ID)
}

// A tick recorded without a run has its own key in the deadline index, after every run
// key's place for the same instant: l/<deadline>#<workflow>/<tick unixnano>. ('#' is no
// run ID's character.)
func keyTickDeadline(deadline time.Time, workflow string, tick time.Time) []byte {
	k := append(binary.BigEndian.AppendUint64([]byte("l/"), uint64(deadline.UnixNano())), "#"+workflow+"/"...)
	return binary.BigEndian.AppendUint64(k, uint64(tick.UnixNano()))
}

// DueTick is a tick of the deadline index: recorded without a run, due.
type DueTick struct {
	Workflow string
	At       time.Time
}

// tickDeadlineDone drops a tick's deadline key once a backfill ran it.
func (tx *applyBatch) tickDeadlineDone(workflow string, at time.Time) {
	var t Tick
	if found, err := getJSON(tx.s.db, keyTick(workflow, at), &t); err == nil && found && !t.Deadline.IsZero() {
		_ = tx.b.Delete(keyTickDeadline(t.Deadline, workflow, at), nil)
	}
}

// tickDeadlineMissed counts a tick that never ran by its deadline ("it did not even
// start") and takes it out of the index.
func (tx *applyBatch) tickDeadlineMissed(e *Entry) error {
	key := keyTick(e.Tick.Workflow, e.Tick.At)
	var t Tick
	found, err := getJSON(tx.s.db, key, &t)
	if err != nil {
		return err
	}
	switch {
	case found && TickRan(t.Outcome):
		return fmt.Errorf("%w: the tick of %s at %s ran (%s)", ErrConflict, e.Tick.Workflow, e.Tick.At.Format(time.RFC3339), t.Outcome)
	case !found || t.Deadline.IsZero():
		return fmt.Errorf("%w: no tick of %s at %s with a deadline", ErrNotFound, e.Tick.Workflow, e.Tick.At.Format(time.RFC3339))
	case t.DeadlineMissed || tx.ticks[string(key)+"#missed"]:
		return fmt.Errorf("%w: the tick's missed deadline is recorded", ErrConflict)
	}
	tx.mark(append(key, "#missed"...), &tx.ticks) // the batch does not read its own writes
	t.DeadlineMissed = true
	_ = tx.b.Delete(keyTickDeadline(t.Deadline, t.Workflow, t.At), nil)
	tx.s.countDeadlineMissed(t.Workflow)
	return tx.putJSON(key, t)
}

func (tx *applyBatch) deadlineMissed(c *cachedRun, e *Entry) error {
	r := c.run
	switch {
	case r.Deadline.IsZero():
		return tx.conflict(c, e, "the run has no deadline")
	case r.DeadlineMissed:
		return tx.conflict(c, e, "the run's missed deadline is recorded")
	case r.Status == StatusSucceeded && !tx.s.hooks.NoDeadlineCheck:
		return tx.conflict(c, e, "the run succeeded")
	}
	c.touch(e)
	r.DeadlineMissed = true
	tx.detail = fmt.Sprintf("not succeeded by %s (it is %s)", r.Deadline.UTC().Format(time.RFC3339), r.Status)
	tx.s.countDeadlineMissed(r.Workflow)
	return nil
}

// DueDeadlines returns up to limit runs whose deadline is due at now and that have not
// succeeded, the ticks due that never ran, and the earliest deadline not yet due (zero
// if none).
func (s *Store) DueDeadlines(now time.Time, limit int) ([]string, []DueTick, time.Time, error) {
	var due []string
	var ticks []DueTick
	var next time.Time
	err := scan(s.db, prefixDeadlines, nil, func(k, _ []byte) (bool, error) {
		if len(k) < len(prefixDeadlines)+8 {
			return false, fmt.Errorf("checkpoint: deadline key %q is corrupt", k)
		}
		at := time.Unix(0, int64(binary.BigEndian.Uint64(k[len(prefixDeadlines):])))
		if at.After(now) {
			next = at
			return false, nil
		}
		if len(due)+len(ticks) >= limit {
			return false, nil
		}
		rest := k[len(prefixDeadlines)+8:]
		if len(rest) > 9 && rest[0] == '#' { // #<workflow>/<tick:8>
			ticks = append(ticks, DueTick{Workflow: string(rest[1 : len(rest)-9]), At: time.Unix(0, int64(binary.BigEndian.Uint64(rest[len(rest)-8:]))).UTC()})
			return true, nil
		}
		due = append(due, string(rest))
		return true, nil
	})
	return due, ticks, next, err
}

// DeadlinesMissed counts, by workflow, the runs this node saw miss their deadline since
// it started (flow_runs_deadline_missed_total).
func (s *Store) DeadlinesMissed() map[string]int64 {
	s.missedMu.Lock()
	defer s.missedMu.Unlock()
	out := make(map[string]int64, len(s.missed))
	for k, v := range s.missed {
		out[k] = v
	}
	return out
}

func (s *Store) countDeadlineMissed(workflow string) {
	s.missedMu.Lock()
	defer s.missedMu.Unlock()
	if s.missed == nil {
		s.missed = map[string]int64{}
	}
	s.missed[workflow]++
}

// Handlers: a run whose workflow has on_failure, on_dead_letter or
// on_deadline steps carries their step lists from its submit (Run.Handlers). When the
// run fails, is dead-lettered or misses its deadline, the applier itself starts a
// handler run of that list, with an ID derived from the run, the event and how many of
// it came before (ChildID(run, "on-failure", n)): every node applies the same entry the
// same way, so each event starts one handler run, whatever fails over, and the handler
// is checkpointed and fenced like any run. It does not change the run's outcome.

// HandlerRef names the run and event a handler run handles, with what its templates see
// of that run (run.error, run.failed_step).
type HandlerRef struct {
	Run        string `json:"run"`
	Event      string `json:"event"` // on_failure | on_dead_letter | on_deadline
	Error      string `json:"error,omitempty"`
	FailedStep string `json:"failed_step,omitempty"`
	// RunCreatedAt is when the handled run was created: a run started by hand has no
	// tick, and its data interval is the schedule's at its start (workflow.Interval), so
	// its handler's templates read that, not one at the handler's own, later, creation.
	// Zero in a handler run recorded before it was kept.
	RunCreatedAt time.Time `json:"run_created_at,omitzero"`
}

// TriggerHandler is a handler run's trigger.
const TriggerHandler = "handler"

// startHandler starts the handler run of event for c, if its workflow has one.
func (tx *applyBatch) startHandler(c *cachedRun, idx int, e *Entry, event string) error {
	r := c.run
	steps := r.Handlers[event]
	if len(steps) == 0 || r.Handler != nil {
		return nil
	}
	n := 0
	for _, h := range r.HandlerRuns {
		if strings.Contains(h, ".on-"+strings.ReplaceAll(event[3:], "_", "-")) {
			n++
		}
	}
	id := ChildID(r.ID, "on-"+strings.ReplaceAll(event[3:], "_", "-"), n)
	if existing, err := tx.load(id); err != nil {
		return err
	} else if existing != nil {
		return nil // a run of that ID exists (given by hand): the event's handler is not started twice
	}
	ref := &HandlerRef{Run: r.ID, Event: event, Error: r.Error, FailedStep: r.FailedStep, RunCreatedAt: r.CreatedAt}
	if event == OnDeadLetterEvent {
		ref.Error = r.DeadLetter
	}
	h := &Run{ID: id, Workflow: r.Workflow, Version: r.Version, Status: StatusPending, Trigger: TriggerHandler,
		ScheduledAt: r.ScheduledAt, Inputs: r.Inputs, MaxEpochs: r.MaxEpochs, Epochs: []EpochRecord{},
		CreatedSeq: tx.seq, CreatedAt: e.At, UpdatedAt: e.At, StartedBy: r.StartedBy, Handler: ref, Trace: r.Trace, KeyScheme: r.KeyScheme, Priority: r.Priority}
	hc := &cachedRun{run: h, steps: make(map[string]*Step, len(steps)), runDirty: true, dirtySteps: map[string]bool{}}
	for _, st := range steps {
		h.Steps = append(h.Steps, st.Name)
		hc.steps[st.Name] = &Step{Name: st.Name, Foreach: st.Foreach, Status: StepPending}
		hc.dirtySteps[st.Name] = true
	}
	tx.s.runs[id] = hc
	tx.use(hc)
	r.HandlerRuns = append(r.HandlerRuns, id)
	c.runDirty = true
	tx.event(hc, idx, e, "accepted", fmt.Sprintf("%s handler of %s", event, r.ID))
	if tx.detail != "" {
		tx.detail += "; "
	}
	tx.detail += fmt.Sprintf("%s: handler run %s started", event, id)
	return nil
}

// The handler events, as in workflow keys (workflow.OnFailure...).
const (
	OnFailureEvent    = "on_failure"
	OnDeadLetterEvent = "on_dead_letter"
	OnDeadlineEvent   = "on_deadline"
)
