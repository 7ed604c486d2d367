// Package invariants checks DESIGN.md's invariants of the state machine on a log while
// it is applied to a store, message by message: the one checker of the property test
// (checkpoint's TestFencingInvariantsProperty and TestFencingGuardsAreNeeded) and of the
// deterministic simulation (engine/internal/sim), so that both hold the state machine to
// the same rules.
//
// A Checker keeps a model of what the accepted entries imply (each run's epoch, its
// accepted commits, the owner of each epoch, the highest term accepted, the runs fired
// for each cron tick) built from the entries and their verdicts alone, and compares the
// store's state with it after every message:
//
//   - invariant 1: no (step, item) of a run has two accepted commits;
//   - invariant 2: an accepted commit carries the run's current epoch;
//   - invariant 3: no step is started again once its checkpoint was accepted;
//   - invariant 4: a cron fire time makes at most one run;
//   - invariant 5: epoch changes never exceed max_epochs, an assign that found them
//     exceeded left the run dead-lettered, and a dead-lettered run accepts nothing but a
//     retry, a purge or the mark of its missed deadline;
//   - invariant 8, as far as the log can tell: an epoch has one owner, ever (the claim
//     once rule), and a side effect reported with SideEffect happens only while its epoch
//     is the run's current one;
//   - a scheduler entry of a term below the highest accepted term is never accepted;
//   - invariant 11 (the waits): a park carries the run's current epoch; a signal is
//     consumed by one accepted commit, once, and that commit's step holds it at the
//     epoch that consumed it; a signal id is in a run's inbox once; a waiting run has no
//     owner;
//   - the third round's rules: a signal accepted for a run is kept in its inbox (or was
//     there: an id applied once); an approval accepted while the run waits on its step
//     counts (not an excluded person's, not a repeat: distinct people); a cancelled
//     run's children have ended with the cancel; a missed deadline is never recorded on
//     a run that had succeeded;
//   - a timer wakes once: an accepted wake ends the park it names, which is the run's
//     current park and was not ended by a wake before, and not before that park's due
//     time (its Waiting.Until, as the run's state had it before the wake);
//   - a handler runs once per event: a run holds at most as many handler runs of an
//     event (on_failure, on_dead_letter, on_deadline) as the log gave it occurrences of
//     it (entries that failed or dead-lettered it, accepted deadline misses);
//   - the gate: the cluster version is never raised above what a member reads (the
//     members as Member told the checker; none: no check);
//   - nothing the state calls running lacks an owner; no step is running in a run that
//     is not; a foreach step's item checkpoints and its count agree.
//
// Every error is a *Violation whose message starts with the invariant it breaks
// ("invariant 2: ..."), which the negative controls match.
package invariants

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// State is what the checker reads of the store the log is applied to (a
// *checkpoint.Store).
type State interface {
	Run(id string) (*checkpoint.Run, error)
	Steps(id string) ([]checkpoint.Step, error)
	Items(run, step string) ([]checkpoint.Item, error)
}

var _ State = (*checkpoint.Store)(nil)

// Violation is a broken invariant.
type Violation struct {
	// Invariant names it: "1" to "9" for DESIGN.md's, "term" for a stale term accepted,
	// "state" for the state's own consistency (running without an owner, ...).
	Invariant string
	Seq       uint64 // the message after which it was found (0: not a message's)
	Msg       string // the whole message, starting with the invariant
}

func (v *Violation) Error() string { return v.Msg }

func violation(inv string, seq uint64, format string, args ...any) *Violation {
	return &Violation{Invariant: inv, Seq: seq, Msg: fmt.Sprintf(format, args...)}
}

// Checker follows one log. The zero value is not ready: use New.
type Checker struct {
	highTerm int64
	runs     map[string]*runModel
	cron     map[string]string // workflow and scheduled time -> the cron run made for it
	members  map[string]int    // node -> the newest log format it reads (Member)
}

// runModel is what the accepted entries say of one run.
type runModel struct {
	epoch     int64             // as the accepted assigns made it (0: never assigned)
	accepted  map[string]int    // accepted commits per step/item
	committed map[string]uint64 // the sequence of each step/item's accepted commit
	owners    map[int64]string  // the owner each epoch had
	ownedAt   map[int64]uint64  // the sequence at which each epoch got its owner
	consumed  map[uint64]string // inbox signal (its sequence) -> the step/item whose commit took it
	children  map[string]string // parent step/item -> the child run started for it
	signals   map[string]bool   // the ids of the signals accepted for it
	park      uint64            // the sequence of its last accepted park (0: none)
	parkWoken bool              // a wake ended that park
	events    map[string]int    // handler events (on_failure, ...) that happened to it
}

// New returns a checker of a log from its first message.
func New() *Checker {
	return &Checker{runs: map[string]*runModel{}, cron: map[string]string{}}
}

// Before is the state of the runs a message names, read before it is applied (nil for a
// run the state does not have).
type Before map[string]*checkpoint.Run

// ReadBefore reads the runs entries name from s: call it before applying them.
func ReadBefore(s State, entries []checkpoint.Entry) Before {
	b := Before{}
	for _, e := range entries {
		if e.Run == "" {
			continue
		}
		if _, ok := b[e.Run]; ok {
			continue
		}
		r, err := s.Run(e.Run)
		if err != nil {
			r = nil
		}
		b[e.Run] = r
	}
	return b
}

// Member says that node is a member of the cluster reading log formats up to reads (from
// now on: a node upgraded says so again): the cluster version must not move past it.
func (c *Checker) Member(node string, reads int) {
	if c.members == nil {
		c.members = map[string]int{}
	}
	c.members[node] = reads
}

// Epoch is the run's current epoch as the accepted assigns made it (0: none).
func (c *Checker) Epoch(run string) int64 {
	if m := c.runs[run]; m != nil {
		return m.epoch
	}
	return 0
}

// HighestTerm is the highest term of an accepted entry.
func (c *Checker) HighestTerm() int64 { return c.highTerm }

func stepItem(run, step string, item int) string { return fmt.Sprintf("%s/%s/%d", run, step, item) }

func (c *Checker) model(run string) *runModel {
	m := c.runs[run]
	if m == nil {
		m = &runModel{accepted: map[string]int{}, committed: map[string]uint64{}, owners: map[int64]string{}, ownedAt: map[int64]uint64{}, consumed: map[uint64]string{}}
		c.runs[run] = m
	}
	return m
}

// Message checks the message applied to s at seq: its entries, their verdicts (one per
// entry, nil if accepted), and the state of every run it names afterwards. before is
// ReadBefore's answer for the entries, read before the apply.
func (c *Checker) Message(s State, seq uint64, before Before, entries []checkpoint.Entry, verdicts []error) error {
	if len(verdicts) != len(entries) {
		return violation("9", seq, "message %d: %d verdicts for %d entries (a message that did not decode?)", seq, len(verdicts), len(entries))
	}
	firstOf := map[string]bool{} // runs an earlier entry of this message named
	touched := []string{}
	deadLettered := map[string]bool{} // runs an assign of this message dead-lettered
	retried := map[string]bool{}      // runs an accepted retry of this message revived
	cancelled := map[string]bool{}    // runs an accepted cancel of this message ended
	// ended: the handler event an entry of this message brought a run (a retry later in
	// the message may have revived it: its status then no longer says so).
	ended := map[string]string{}
	for i, e := range entries {
		err := verdicts[i]
		first := e.Run != "" && !firstOf[e.Run]
		if e.Run != "" && first {
			firstOf[e.Run] = true
			touched = append(touched, e.Run)
		}
		if err == nil && e.Term > 0 && e.Term < c.highTerm {
			return violation("term", seq, "stale term accepted: %s of %s with term %d after term %d (seq %d)", e.Kind, e.Run, e.Term, c.highTerm, seq)
		}
		if e.Term > 0 && err == nil { // only an accepted entry raises the term
			c.highTerm = max(c.highTerm, e.Term)
		}
		// A missed deadline is marked on any run that had not succeeded by it, a
		// dead-lettered one too (docs/workflow-spec.md, "Deadlines"): it moves no epoch.
		if err == nil && first && e.Kind != checkpoint.KindRetry && e.Kind != checkpoint.KindPurge && e.Kind != checkpoint.KindDeadlineMissed {
			if b := before[e.Run]; b != nil && b.Status == checkpoint.StatusDeadLettered {
				return violation("5", seq, "invariant 5: %s accepted on dead-lettered run %s (seq %d)", e.Kind, e.Run, seq)
			}
		}
		switch e.Kind {
		case checkpoint.KindSubmit, checkpoint.KindCronTick:
			if err != nil || e.Submit == nil {
				continue
			}
			delete(c.runs, e.Run) // a new run (a retired one's ID may come back)
			c.model(e.Run)
			if p := e.Submit.Parent; p != nil {
				pm := c.model(p.Run)
				if pm.children == nil {
					pm.children = map[string]string{}
				}
				k := stepItem(p.Run, p.Step, p.Item)
				if other, ok := pm.children[k]; ok && other != e.Run {
					return violation("11", seq, "invariant 11: %s started two child runs, %s and %s (seq %d)", k, other, e.Run, seq)
				}
				pm.children[k] = e.Run
			}
			if e.Submit.Trigger == checkpoint.TriggerCron {
				k := e.Submit.Workflow + "@" + e.Submit.ScheduledAt.UTC().Format(time.RFC3339Nano)
				if other, ok := c.cron[k]; ok && other != e.Run {
					return violation("4", seq, "invariant 4: the fire time %s made two runs, %s and %s (seq %d)", k, other, e.Run, seq)
				}
				c.cron[k] = e.Run
			}
		case checkpoint.KindComplete:
			if err == nil && e.Status == checkpoint.StatusFailed {
				ended[e.Run] = checkpoint.OnFailureEvent
			}
		case checkpoint.KindDeadLetter:
			if err == nil || errors.Is(err, checkpoint.ErrDeadLettered) {
				ended[e.Run] = checkpoint.OnDeadLetterEvent
			}
		case checkpoint.KindAssign:
			if errors.Is(err, checkpoint.ErrDeadLettered) {
				deadLettered[e.Run] = true
				ended[e.Run] = checkpoint.OnDeadLetterEvent
			}
			if err != nil {
				continue
			}
			m := c.model(e.Run)
			m.epoch = int64(seq)
			if e.Worker != "" {
				m.owners[m.epoch], m.ownedAt[m.epoch] = e.Worker, seq
			}
		case checkpoint.KindClaim:
			if err != nil {
				continue
			}
			m := c.model(e.Run)
			if prev, ok := m.owners[e.Epoch]; ok && prev != e.Owner {
				return violation("8", seq, "invariant 8: epoch %d of %s claimed by %s after %s owned it: an epoch has one owner (seq %d)", e.Epoch, e.Run, e.Owner, prev, seq)
			}
			if _, ok := m.ownedAt[e.Epoch]; !ok {
				m.ownedAt[e.Epoch] = seq
			}
			m.owners[e.Epoch] = e.Owner
		case checkpoint.KindCommit:
			if err != nil {
				continue
			}
			m := c.model(e.Run)
			// Invariant 2: an accepted commit carries the run's current epoch.
			if e.Epoch != m.epoch {
				return violation("2", seq, "invariant 2: commit of %s by %s with epoch %d accepted while the run's epoch is %d (seq %d)",
					stepItem(e.Run, e.Step, e.Item), e.Owner, e.Epoch, m.epoch, seq)
			}
			// Invariant 1: no (step, item) has two accepted commits.
			k := stepItem(e.Run, e.Step, e.Item)
			m.accepted[k]++
			m.committed[k] = seq
			if m.accepted[k] > 1 {
				return violation("1", seq, "invariant 1: double commit of %s (second by %s, epoch %d, seq %d)", k, e.Owner, e.Epoch, seq)
			}
			if v := childBound(s, seq, e); v != nil {
				return v
			}
			if e.Consume > 0 {
				if by, ok := m.consumed[e.Consume]; ok {
					return violation("11", seq, "invariant 11: the signal at sequence %d of %s consumed twice, by %s and by %s (seq %d)", e.Consume, e.Run, by, k, seq)
				}
				m.consumed[e.Consume] = k
			}
		case checkpoint.KindPark:
			if err == nil && e.Epoch != c.model(e.Run).epoch {
				return violation("11", seq, "invariant 11: park of %s by %s with epoch %d accepted while the run's epoch is %d (seq %d)", e.Run, e.Owner, e.Epoch, c.model(e.Run).epoch, seq)
			}
			if err == nil {
				m := c.model(e.Run)
				m.park, m.parkWoken = seq, false
				if v := childrenBound(s, seq, e); v != nil {
					return v
				}
			}
		case checkpoint.KindWake:
			if err != nil {
				continue
			}
			if v := c.wakeOnce(seq, before[e.Run], first, e); v != nil {
				return v
			}
		case checkpoint.KindClusterVersion:
			if err != nil {
				continue
			}
			for _, id := range slices.Sorted(maps.Keys(c.members)) {
				if reads := c.members[id]; reads < e.ClusterVersion {
					return violation("gate", seq, "gate: the cluster version raised to %d while node %s, a member, reads log formats up to %d (seq %d)", e.ClusterVersion, id, reads, seq)
				}
			}
		case checkpoint.KindStart:
			// Invariant 3: a step with a checkpoint is never started again.
			if err == nil && c.model(e.Run).accepted[stepItem(e.Run, e.Step, checkpoint.ItemWhole)] > 0 {
				return violation("3", seq, "invariant 3: step %s of %s started again after its checkpoint (by %s, epoch %d, seq %d)", e.Step, e.Run, e.Owner, e.Epoch, seq)
			}
		case checkpoint.KindRetry:
			if err == nil {
				retried[e.Run] = true
				m := c.model(e.Run)
				for _, st := range e.Steps { // retry --from: the reset steps commit again
					for k := range m.accepted {
						if strings.HasPrefix(k, stepItem(e.Run, st, 0)[:len(e.Run)+len(st)+2]) {
							delete(m.accepted, k)
							delete(m.committed, k)
						}
					}
				}
			}
		case checkpoint.KindRetire:
			if err == nil {
				delete(c.runs, e.Run)
			}
		case checkpoint.KindSignal:
			if err == nil && e.Signal != nil && e.Signal.ID != "" {
				m := c.model(e.Run)
				if m.signals == nil {
					m.signals = map[string]bool{}
				}
				m.signals[e.Signal.ID] = true
			}
		case checkpoint.KindDecide:
			if err == nil && first {
				if v := approvalCounts(seq, before[e.Run], e); v != nil {
					return v
				}
			}
		case checkpoint.KindCancel:
			if err == nil {
				cancelled[e.Run] = true
			}
		case checkpoint.KindDeadlineMissed:
			if b := before[e.Run]; err == nil && e.Run != "" && first && b != nil && b.Status == checkpoint.StatusSucceeded {
				return violation("deadline", seq, "deadline: a missed deadline recorded on %s, which had succeeded (seq %d)", e.Run, seq)
			}
			if err == nil && e.Run != "" {
				c.model(e.Run).event(checkpoint.OnDeadlineEvent)
			}
		}
	}
	for _, id := range touched {
		if err := c.checkRun(s, seq, id, deadLettered[id] && !retried[id]); err != nil {
			return err
		}
		if err := c.handledOnce(s, seq, id, before[id], ended[id]); err != nil {
			return err
		}
		if cancelled[id] {
			if err := cascaded(s, seq, id); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkRun compares the state of one run after message seq with the model.
func (c *Checker) checkRun(s State, seq uint64, id string, deadLettered bool) error {
	r, err := s.Run(id)
	if errors.Is(err, checkpoint.ErrNotFound) {
		return nil // never submitted, or retired
	}
	if err != nil {
		return violation("state", seq, "read run %s: %v", id, err)
	}
	m := c.runs[id]
	if m != nil && m.epoch != 0 && r.Epoch != m.epoch {
		return violation("2", seq, "run %s: epoch %d in the state, the accepted assigns say %d (seq %d)", id, r.Epoch, m.epoch, seq)
	}
	// Invariant 5: epoch changes never exceed max_epochs; past it the run is in the DLQ.
	if r.EpochChanges > r.MaxEpochs {
		return violation("5", seq, "invariant 5: run %s: %d epoch changes > max_epochs %d, status %s (seq %d)", id, r.EpochChanges, r.MaxEpochs, r.Status, seq)
	}
	if deadLettered && r.Status != checkpoint.StatusDeadLettered {
		return violation("5", seq, "invariant 5: an assign dead-lettered run %s but its status is %s (seq %d)", id, r.Status, seq)
	}
	// Invariant 11: the waits.
	if r.Status == checkpoint.StatusWaiting && (r.Owner != "" || r.Waiting == nil) {
		return violation("11", seq, "run %s is waiting with owner %q and wait %v (seq %d)", id, r.Owner, r.Waiting, seq)
	}
	ids := map[string]bool{}
	for _, sg := range r.Inbox {
		if sg.ID != "" && ids[sg.ID] {
			return violation("11", seq, "invariant 11: signal id %q applied twice to %s (seq %d)", sg.ID, id, seq)
		}
		ids[sg.ID] = true
	}
	if m != nil {
		for sid := range m.signals {
			kept := false
			for _, sg := range r.Inbox {
				kept = kept || sg.ID == sid
			}
			if !kept {
				return violation("11", seq, "invariant 11: the signal %q was accepted for %s but its inbox does not hold it (seq %d)", sid, id, seq)
			}
		}
	}
	// Nothing claims to be running without an owner.
	if r.Status == checkpoint.StatusRunning && r.Owner == "" {
		return violation("state", seq, "run %s is running without an owner (seq %d)", id, seq)
	}
	steps, err := s.Steps(id)
	if err != nil {
		return violation("state", seq, "read the steps of %s: %v", id, err)
	}
	for _, sg := range r.Inbox {
		if sg.ConsumedBy == "" {
			continue
		}
		held := false
		for _, st := range steps {
			held = held || st.Name == sg.ConsumedBy && st.Status == checkpoint.StepSucceeded && st.Epoch == sg.ConsumedEpoch
		}
		if !held {
			return violation("11", seq, "invariant 11: the signal at sequence %d of %s is consumed by %s at epoch %d, whose checkpoint does not hold it (seq %d)", sg.Seq, id, sg.ConsumedBy, sg.ConsumedEpoch, seq)
		}
	}
	for _, st := range steps {
		if st.Status == checkpoint.StepRunning && r.Status != checkpoint.StatusRunning {
			return violation("state", seq, "step %s of %s is running while the run is %s (seq %d)", st.Name, id, r.Status, seq)
		}
		if st.Foreach {
			items, err := s.Items(id, st.Name)
			if err != nil {
				return violation("state", seq, "read the items of %s/%s: %v", id, st.Name, err)
			}
			if len(items) != st.ItemsDone {
				return violation("state", seq, "step %s of %s: %d item checkpoints, items_done %d (seq %d)", st.Name, id, len(items), st.ItemsDone, seq)
			}
		}
	}
	return nil
}

// SideEffect checks invariant 8 for a side effect of run's step (item) done by its epoch
// at that moment: the epoch must be the run's current one in the state of the whole log
// appended so far (the reference's, which the checker follows). Its owner's kill switch,
// and the step process's own deadline while its node cannot act, are what keep it so:
// they stop the step before the server can let the lease lapse, and a new epoch needs
// the lapse.
//
// It also checks invariant 3 as a side effect shows it: an epoch that got its owner
// after a step's (or item's) checkpoint was accepted never runs that step again.
func (c *Checker) SideEffect(run, step string, item int, epoch int64) error {
	if cur := c.Epoch(run); cur != epoch {
		return violation("8", 0, "invariant 8: side effect of %s by epoch %d while the run's epoch is %d",
			stepItem(run, step, item), epoch, cur)
	}
	m := c.runs[run]
	owned, ok := m.ownedAt[epoch]
	if !ok {
		return nil
	}
	for _, k := range []string{stepItem(run, step, item), stepItem(run, step, checkpoint.ItemWhole)} {
		if at, done := m.committed[k]; done && at < owned {
			return violation("3", 0, "invariant 3: epoch %d, owned from sequence %d, re-ran %s whose checkpoint was accepted at sequence %d",
				epoch, owned, stepItem(run, step, item), at)
		}
	}
	return nil
}
