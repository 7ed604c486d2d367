package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"
	"unicode"

	"github.com/flowrun/flow/internal/base/ident"
)

// Waits: a run that reaches a step that waits for the world (a signal, people's
// approvals, a timer) parks. Its owner writes a park entry, which ends the epoch
// cleanly: the run is waiting, holds no lease, no task and no worker. What it waits for
// arrives as an entry of its own (a signal, a decide, the scheduler's wake of a due
// timer); the applier then makes the run pending with Resume set, and the scheduler gives
// it a new epoch with reason "resumed", which does not count toward max_epochs. The
// resumed epoch runs the waiting step again, which now finds what it waited for in the
// run's state and commits it.
//
// Fencing (docs/checkpoint.md, "Waits"): a park is a worker's write, judged by the same
// guard as a commit (the run running, the writer's epoch the current one), so a zombie
// cannot park a run another epoch owns. A signal is consumed by the commit of the step
// that takes it (Entry.Consume), in the same entry: a zombie's commit is fenced and its
// consumption with it, so the signal stays for the current epoch; a signal is consumed
// once (a second consumption is a conflict). Signals and decisions are people's entries,
// kept whatever the run's epoch; a wake names the park it ends (ParkSeq), so a wake
// written twice (two leaders' passes, a retry) wakes once.

// Wait kinds (public contract: run get's "waiting.kind").
const (
	WaitSignal   = "signal"
	WaitApproval = "approval"
	WaitTimer    = "timer"
	WaitChild    = "child"
	// WaitConcurrency (slots.go) is the fifth.
)

// MaxDepth bounds how deep child runs nest (a run started by a run started by ...): a
// child beyond it is refused, whatever loop of workflows escaped the check at apply.
const MaxDepth = 8

// MaxChildren bounds the children one run keeps.
const MaxChildren = 10000

// ParentRef names what started a child run: its parent run, step and foreach item.
type ParentRef struct {
	Run  string `json:"run"`
	Step string `json:"step"`
	Item int    `json:"item"`
}

// Limits of what people's entries may pile up on one run: beyond them a signal or a
// decision is refused (a conflict), so no caller can grow a run record without bound.
const (
	MaxInbox       = 1000
	MaxInboxBytes  = 1 << 20
	MaxDecisions   = 1000
	MaxSignalID    = 200
	MaxCommentSize = 2000
)

// Signal is a signal entry's content.
type Signal struct {
	Name string          `json:"name"`
	ID   string          `json:"id,omitempty"` // de-duplication key: the same signal again with it is applied once, another is a conflict
	Data json.RawMessage `json:"data,omitempty"`
}

// Decision is a decide entry's content: an approval or a rejection.
type Decision struct {
	Approve bool   `json:"approve"`
	Comment string `json:"comment,omitempty"`
}

// Wait is what a park entry waits for.
type Wait struct {
	Kind string `json:"kind"`           // signal | approval | timer
	Name string `json:"name,omitempty"` // signal: its name
	// Until is when the wait's timer is due (a timeout, or the time a sleep ends); zero:
	// no timer. A step's first park sets it; later parks of the step keep the first.
	Until time.Time `json:"until,omitzero"`
	// Need, for an approval: distinct approvers that complete it. Exclude: a person whose
	// approval does not count (the run's starter, with not_the_starter).
	// NotTheStarter: the step's not_the_starter, which also excludes the run's InputsBy
	// (a run started by no one, a cron tick's, has no starter to exclude but may have
	// people who changed its inputs).
	Need          int    `json:"need,omitempty"`
	Exclude       string `json:"exclude,omitempty"`
	NotTheStarter bool   `json:"not_the_starter,omitempty"`
	Role          string `json:"role,omitempty"` // for people to read: who may decide
	// Children, for a child wait: the child runs it waits for (all must end).
	Children []string `json:"children,omitempty"`
	// Keys, for a concurrency wait: the step's rendered keys, granted together
	// (slots.go).
	Keys []SlotKey `json:"keys,omitempty"`
}

// Waiting is a parked run's wait: the park's Wait, its step, and the park's sequence.
type Waiting struct {
	Wait
	Step  string    `json:"step"`
	Since time.Time `json:"since"`
	Seq   uint64    `json:"seq"`
	// Ended, for a child wait: those of Children that have ended since the park.
	Ended []string `json:"ended,omitempty"`
}

// SignalRecord is one signal in a run's inbox.
type SignalRecord struct {
	Seq    uint64          `json:"seq"`
	Name   string          `json:"name"`
	ID     string          `json:"id,omitempty"`
	Data   json.RawMessage `json:"data,omitempty"`
	Sender string          `json:"sender,omitempty"`
	At     time.Time       `json:"at"`
	// ConsumedBy is the step whose commit took it ("" while it waits), in epoch
	// ConsumedEpoch.
	ConsumedBy    string `json:"consumed_by,omitempty"`
	ConsumedEpoch int64  `json:"consumed_epoch,omitempty"`
}

// DecisionRecord is one approval or rejection of an approval step.
type DecisionRecord struct {
	Seq     uint64    `json:"seq"`
	Step    string    `json:"step"`
	Actor   string    `json:"actor"`
	Approve bool      `json:"approve"`
	Comment string    `json:"comment,omitempty"`
	At      time.Time `json:"at"`
}

// Timer is a wait's deadline.
type Timer struct {
	Until time.Time `json:"until"`
	Fired bool      `json:"fired,omitempty"`
}

// NextSignal is the oldest signal named name that no step has consumed, or nil.
func (r *Run) NextSignal(name string) *SignalRecord {
	for i := range r.Inbox {
		if s := &r.Inbox[i]; s.Name == name && s.ConsumedBy == "" {
			return s
		}
	}
	return nil
}

// Unlike says how s differs from the signal rec holds under the same ID ("" when s
// repeats it: the same name and the same data, as JSON, spaces aside). A repeat is
// applied once; anything else under an applied ID is a conflict, since the inbox keeps
// the first and would drop the second without a word. Deterministic: it reads only the
// two entries.
func (rec *SignalRecord) Unlike(s *Signal) string {
	switch {
	case rec.Name != s.Name:
		return fmt.Sprintf("id %q was applied at sequence %d to signal %s: one id is one signal; send this one under another id", rec.ID, rec.Seq, rec.Name)
	case !sameJSON(rec.Data, s.Data):
		return fmt.Sprintf("id %q was applied at sequence %d with other data: one id is one signal; send this one under another id", rec.ID, rec.Seq)
	}
	return ""
}

// sameJSON reports whether a and b are the same JSON text but for insignificant spaces
// (none or empty: no data).
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return false
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

// TimerFired reports whether step's wait timer fired.
func (r *Run) TimerFired(step string) bool {
	t := r.Timers[step]
	return t != nil && t.Fired
}

// ready reports whether what the parked run waits for is there.
func (r *Run) ready(ignoreInputsBy bool) bool {
	w := r.Waiting
	if w == nil {
		return false
	}
	if r.TimerFired(w.Step) {
		return true
	}
	switch w.Kind {
	case WaitSignal:
		return r.NextSignal(w.Name) != nil
	case WaitApproval:
		rule := w.Rule()
		rule.IgnoreInputsBy = ignoreInputsBy
		approvers, _, rejected := r.Approvals(w.Step, rule)
		return rejected != nil || len(approvers) >= w.Need
	case WaitChild:
		return len(w.Ended) >= len(w.Children)
	}
	return false
}

func (e *Entry) validateWait(bad func(string, ...any) error, needsEpoch, needsStep func() error) error {
	switch e.Kind {
	case KindSignal:
		s := e.Signal
		if s == nil || !ident.ValidName(s.Name) {
			return bad("a signal needs a name of 1-64 of a-z, 0-9, '_' or '-'")
		}
		if len(s.ID) > MaxSignalID || !printable(s.ID) {
			return bad("signal id: at most %d printable characters", MaxSignalID)
		}
		if len(s.Data) > 0 && !json.Valid(s.Data) {
			return bad("signal data is not valid JSON")
		}
	case KindDecide:
		if e.Decision == nil {
			return bad("a decide entry needs its decision")
		}
		if len(e.Decision.Comment) > MaxCommentSize || !printable(e.Decision.Comment) {
			return bad("comment: at most %d printable characters", MaxCommentSize)
		}
		if err := needsStep(); err != nil {
			return err
		}
		if e.Item != ItemWhole {
			return bad("a decision is about a whole step (item %d)", ItemWhole)
		}
	case KindPark:
		if err := needsEpoch(); err != nil {
			return err
		}
		if err := needsStep(); err != nil {
			return err
		}
		w := e.Wait
		switch {
		case e.Item != ItemWhole:
			return bad("a park is about a whole step (item %d)", ItemWhole)
		case w == nil:
			return bad("a park needs what it waits for")
		case w.Kind == WaitSignal && !ident.ValidName(w.Name):
			return bad("a signal wait needs the signal's name")
		case w.Kind == WaitApproval && w.Need < 1:
			return bad("an approval wait needs at least one approver")
		case w.Kind == WaitTimer && w.Until.IsZero():
			return bad("a timer wait needs its time")
		case w.Kind == WaitChild && (len(w.Children) == 0 || len(w.Children) > MaxChildren):
			return bad("a child wait needs its children (1 to %d)", MaxChildren)
		case w.Kind == WaitConcurrency && validSlotKeys(w.Keys) != "":
			return bad("%s", validSlotKeys(w.Keys))
		case w.Kind == WaitConcurrency && !w.Until.IsZero():
			return bad("a concurrency wait has no timer")
		case w.Kind != WaitSignal && w.Kind != WaitApproval && w.Kind != WaitTimer && w.Kind != WaitChild && w.Kind != WaitConcurrency:
			return bad("wait kind %q: use signal, approval, timer, child or concurrency", w.Kind)
		}
		for _, id := range w.Children {
			if !ident.ValidID(id) {
				return bad("child %q: %s", id, ident.IDRule)
			}
		}
	case KindWake:
		if e.Term <= 0 {
			return bad("term is required on a scheduler entry")
		}
		if err := needsStep(); err != nil {
			return err
		}
		if e.ParkSeq == 0 {
			return bad("a wake names the park it ends (park_seq)")
		}
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) && r != '\n' {
			return false
		}
	}
	return true
}

// wakeRun makes a parked run pending for a resumed epoch.
func (c *cachedRun) wakeRun() {
	c.run.Status = StatusPending
	c.run.Resume = true
	c.run.Waiting = nil
}

func (tx *applyBatch) signal(c *cachedRun, e *Entry) error {
	r := c.run
	if r.Status.Terminal() {
		return tx.conflict(c, e, "the run has ended: a signal reaches only a run that has not")
	}
	if e.Signal.ID != "" && !tx.s.hooks.NoSignalDedup {
		for _, s := range r.Inbox {
			if s.ID != e.Signal.ID {
				continue
			}
			if why := s.Unlike(e.Signal); why != "" {
				return tx.conflict(c, e, "%s", why)
			}
			tx.detail = fmt.Sprintf("signal %s: id %q was applied at sequence %d; applied once", e.Signal.Name, s.ID, s.Seq)
			return nil
		}
	}
	if tx.s.hooks.NoEarlySignals && (r.Status != StatusWaiting || r.Waiting.Kind != WaitSignal || r.Waiting.Name != e.Signal.Name) {
		tx.detail = "signal " + e.Signal.Name + ": dropped, no wait for it (control)"
		return nil
	}
	if len(r.Inbox) >= MaxInbox {
		return tx.conflict(c, e, "the run holds %d signals, the most it keeps", MaxInbox)
	}
	if held := r.InboxBytes(); held+len(e.Signal.Data) > MaxInboxBytes && !tx.s.hooks.NoInboxBytes {
		return tx.conflict(c, e, "the run's inbox holds %d bytes of signal data; %d more would pass its limit of %d bytes", held, len(e.Signal.Data), MaxInboxBytes)
	}
	c.touch(e)
	r.Inbox = append(r.Inbox, SignalRecord{Seq: tx.seq, Name: e.Signal.Name, ID: e.Signal.ID, Data: e.Signal.Data, Sender: e.Actor, At: e.At})
	tx.detail = "signal " + e.Signal.Name
	if r.Status == StatusWaiting && r.ready(tx.s.hooks.NoInputsByExclude) {
		c.wakeRun()
		tx.detail += "; the run wakes"
	}
	return nil
}

func (tx *applyBatch) decide(c *cachedRun, e *Entry) error {
	r := c.run
	if r.Status.Terminal() {
		return tx.conflict(c, e, "the run has ended")
	}
	st, err := tx.step(c, e)
	if err != nil {
		return err
	}
	if why := r.decisionIgnored(st, e, tx.s.hooks.NoInputsByExclude); why != "" && !tx.s.hooks.NoDecisionCheck {
		return tx.conflict(c, e, "%s", why)
	}
	if len(r.Decisions) >= MaxDecisions {
		return tx.conflict(c, e, "the run holds %d decisions, the most it keeps", MaxDecisions)
	}
	c.touch(e)
	r.Decisions = append(r.Decisions, DecisionRecord{Seq: tx.seq, Step: e.Step, Actor: e.Actor, Approve: e.Decision.Approve, Comment: e.Decision.Comment, At: e.At})
	tx.detail = "reject"
	if e.Decision.Approve {
		tx.detail = "approve"
	}
	if r.Status == StatusWaiting && r.Waiting.Step == e.Step && r.ready(tx.s.hooks.NoInputsByExclude) {
		c.wakeRun()
		tx.detail += "; the run wakes"
	}
	return nil
}

// InboxBytes is the signal data the run's inbox holds, consumed or not (all of it is in
// the run's record, which every change of the run rewrites).
func (r *Run) InboxBytes() int {
	n := 0
	for i := range r.Inbox {
		n += len(r.Inbox[i].Data)
	}
	return n
}

func (tx *applyBatch) park(c *cachedRun, e *Entry) error {
	if f := tx.guard(c, e); f != nil {
		return f
	}
	st, err := tx.step(c, e)
	if err != nil {
		return err
	}
	switch st.Status {
	case StepSucceeded, StepSkipped:
		return tx.fenced(c, e, "checkpoint-exists")
	case StepFailed:
		return tx.conflict(c, e, "step %q already failed", st.Name)
	}
	r := c.run
	// The children it waits for are judged before anything changes: a refused park
	// leaves the run as it was (it was running and parked in the state, once).
	var ended []string
	if e.Wait.Kind == WaitChild {
		for _, id := range e.Wait.Children {
			child, err := tx.load(id)
			if err != nil {
				return err
			}
			if child == nil || child.run.Parent == nil || child.run.Parent.Run != r.ID {
				return fmt.Errorf("%w: run %s has no child %s", ErrInvalidEntry, r.ID, id)
			}
			if child.run.Status.Terminal() {
				ended = append(ended, id)
			}
		}
	}
	c.touch(e)
	c.reset()
	w := *e.Wait
	if !w.Until.IsZero() {
		if r.Timers == nil {
			r.Timers = map[string]*Timer{}
		}
		if t := r.Timers[e.Step]; t != nil {
			w.Until = t.Until // the step's first park set its deadline
		} else {
			r.Timers[e.Step] = &Timer{Until: w.Until}
		}
	}
	r.Status = StatusWaiting
	r.Owner = ""
	r.Waiting = &Waiting{Wait: w, Step: e.Step, Since: e.At, Seq: tx.seq}
	tx.detail = fmt.Sprintf("waits for %s", w.Kind)
	r.Waiting.Ended = ended
	if r.ready(tx.s.hooks.NoInputsByExclude) {
		c.wakeRun() // what it waits for came while it parked: it resumes at once
		tx.detail += "; ready: the run wakes"
	}
	return nil
}

func (tx *applyBatch) wake(c *cachedRun, e *Entry) error {
	r := c.run
	if r.Status != StatusWaiting || !tx.s.hooks.NoParkCheck && (r.Waiting.Seq != e.ParkSeq || r.Waiting.Step != e.Step) {
		return tx.conflict(c, e, "the run is not parked at sequence %d on step %q", e.ParkSeq, e.Step)
	}
	if r.Waiting.Kind == WaitConcurrency {
		// The leader's grant: its term was judged before this rule, so a deposed
		// leader's wake is refused; the park's sequence makes a second wake a conflict.
		c.touch(e)
		c.grantSlots(tx.seq)
		c.wakeRun()
		tx.detail = "slots granted"
		return nil
	}
	t := r.Timers[r.Waiting.Step]
	if t == nil {
		return tx.conflict(c, e, "step %q has no timer", r.Waiting.Step)
	}
	c.touch(e)
	t.Fired = true
	c.wakeRun()
	tx.detail = "timer fired"
	return nil
}

// consume takes the inbox signal at seq for the commit of step (already judged by the
// guard and the checkpoint check).
func (tx *applyBatch) consume(c *cachedRun, e *Entry) error {
	r := c.run
	for i := range r.Inbox {
		s := &r.Inbox[i]
		if s.Seq != e.Consume {
			continue
		}
		if s.ConsumedBy != "" && !tx.s.hooks.NoConsumeOnce {
			return tx.conflict(c, e, "the signal at sequence %d was consumed by step %q (epoch %d)", s.Seq, s.ConsumedBy, s.ConsumedEpoch)
		}
		c.touch(e)
		s.ConsumedBy, s.ConsumedEpoch = e.Step, e.Epoch
		return nil
	}
	return fmt.Errorf("%w: run %s has no signal at sequence %d", ErrInvalidEntry, r.ID, e.Consume)
}

// alarmKey is a parked run's key in the timer index (nil: not parked on a timer that
// has not fired).
func alarmKey(r *Run) []byte {
	if r == nil || r.Status != StatusWaiting || r.Waiting == nil || r.Waiting.Until.IsZero() || r.TimerFired(r.Waiting.Step) {
		return nil
	}
	return append(binary.BigEndian.AppendUint64([]byte("a/"), uint64(r.Waiting.Until.UnixNano())), r.ID...)
}

var prefixAlarms = []byte("a/")

// Due is a parked run whose timer is due: the scheduler writes its wake.
type Due struct {
	Run     string
	Step    string
	ParkSeq uint64
	Until   time.Time
}

// DueTimers returns up to limit parked runs whose timer is due at now, earliest first,
// and the time of the earliest timer not yet due (zero if none): the scheduler sleeps
// until then. It reads an index, so 100,000 parked runs cost a pass only the due ones.
func (s *Store) DueTimers(now time.Time, limit int) ([]Due, time.Time, error) {
	var due []Due
	var next time.Time
	var ids []string
	err := scan(s.db, prefixAlarms, nil, func(k, _ []byte) (bool, error) {
		if len(k) < len(prefixAlarms)+8 {
			return false, fmt.Errorf("checkpoint: timer key %q is corrupt", k)
		}
		at := time.Unix(0, int64(binary.BigEndian.Uint64(k[len(prefixAlarms):])))
		if at.After(now) {
			next = at
			return false, nil
		}
		if len(ids) >= limit {
			return false, nil
		}
		ids = append(ids, string(k[len(prefixAlarms)+8:]))
		return true, nil
	})
	if err != nil {
		return nil, time.Time{}, err
	}
	for _, id := range ids {
		r, err := s.Run(id)
		if err != nil || r.Waiting == nil {
			continue // moved on since the index was read
		}
		due = append(due, Due{Run: id, Step: r.Waiting.Step, ParkSeq: r.Waiting.Seq, Until: r.Waiting.Until})
	}
	return due, next, nil
}

// setAlarm keeps the timer index in step with the run at commit.
func (tx *applyBatch) setAlarm(c *cachedRun) {
	now := alarmKey(c.run)
	if bytes.Equal(now, c.origAlarm) {
		return
	}
	if c.origAlarm != nil {
		_ = tx.b.Delete(c.origAlarm, nil)
	}
	if now != nil {
		_ = tx.b.Set(now, nil, nil)
	}
}
