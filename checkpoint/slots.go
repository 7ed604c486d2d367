package checkpoint

import (
	"cmp"
	"slices"
	"time"
	"unicode/utf8"
)

// Step slots: a step with `concurrency: {key, limit}` (workflow.Step.Concurrency) runs
// only while it holds a slot of each of its keys, and at most limit steps (or runs, for
// a workflow's keys of the same name) hold one key's slots at once. The slot is a fact of
// the run's state, taken and given back by entries the state machine already fences
// (docs/checkpoint.md, "Step slots"):
//
//   - the step's owner, finding no slot, parks the run on a wait of kind concurrency
//     (WaitConcurrency, with the step's rendered keys): a worker's entry, judged like a
//     commit, so only the current epoch's owner parks;
//   - the leader, when every key has room (engine/internal/leader slots.go), writes the
//     park's wake: a scheduler entry under its term, naming the park (ParkSeq), so two
//     leaders' or two passes' wakes grant once. Its apply grants the slots (Run.Slots) and
//     makes the run pending for a resumed epoch;
//   - the slots are held across epochs (a new epoch after a lease lapsed runs the step
//     again under them: the lapsed owner's processes were stopped at its trust deadline,
//     before the lapse), and given back by the owner's own entries, written after its
//     step processes ended: the step's commit or failure, the run's completion, a park,
//     a hand-back. A zombie's such entry is fenced like any, so it cannot give back what
//     its run holds now;
//   - what ends or restarts the run otherwise (a cancel, a dead-lettering, a missed
//     deadline, a retry) is not the owner's: its processes may still run (a paused
//     owner). Those entries move the slots to Run.Draining, which the leader counts while
//     the run's lease may live (its watch, the slot drain of keys.go); the next claim of
//     the run, which needs the lease free, clears them.

// WaitConcurrency is the wait of a step whose keys have no room (public contract: run
// get's "waiting.kind" concurrency, with the key).
const WaitConcurrency = "concurrency"

// Bounds of a step slot wait: its keys (workflow.MaxKeyLimits), a key's rendered text
// (workflow's 512 bytes, and the prefix of an unrendered key), and a limit.
const (
	MaxSlotKeys     = 8
	MaxSlotKeyBytes = 600
	MaxSlotLimit    = 100000
)

// SlotKey is one rendered key of a step and its limit.
type SlotKey struct {
	Key   string `json:"key"`
	Limit int    `json:"limit"`
}

// StepSlot is a slot a run holds for one of its steps: granted by the wake at Seq.
type StepSlot struct {
	Step  string `json:"step"`
	Key   string `json:"key"`
	Limit int    `json:"limit"`
	Seq   uint64 `json:"seq"`
}

// validSlotKeys checks a concurrency wait's keys.
func validSlotKeys(keys []SlotKey) string {
	if len(keys) == 0 || len(keys) > MaxSlotKeys {
		return "a concurrency wait needs its step's keys (1 to 8)"
	}
	for i, k := range keys {
		switch {
		case k.Key == "" || len(k.Key) > MaxSlotKeyBytes || !utf8.ValidString(k.Key):
			return "a concurrency key is 1 to 600 bytes of UTF-8"
		case k.Limit < 1 || k.Limit > MaxSlotLimit:
			return "a concurrency limit is 1 to 100000"
		case slices.ContainsFunc(keys[:i], func(o SlotKey) bool { return o.Key == k.Key }):
			return "a concurrency key is given once"
		}
	}
	return ""
}

// HoldsSlots reports whether the run holds, for step, a slot of every key in keys.
func (r *Run) HoldsSlots(step string, keys []SlotKey) bool {
	for _, k := range keys {
		if !slices.ContainsFunc(r.Slots, func(s StepSlot) bool { return s.Step == step && s.Key == k.Key }) {
			return false
		}
	}
	return true
}

// SlotKeys are the keys the run's slots count against: those it holds and those it
// drains, one per slot.
func (r *Run) SlotKeys() []SlotKey {
	var out []SlotKey
	for _, s := range r.Slots {
		out = append(out, SlotKey{s.Key, s.Limit})
	}
	for _, s := range r.Draining {
		out = append(out, SlotKey{s.Key, s.Limit})
	}
	return out
}

// grantSlots gives the run parked on a concurrency wait its slots (the leader's wake).
func (c *cachedRun) grantSlots(seq uint64) {
	r := c.run
	for _, k := range r.Waiting.Keys {
		if !r.HoldsSlots(r.Waiting.Step, []SlotKey{k}) {
			r.Slots = append(r.Slots, StepSlot{Step: r.Waiting.Step, Key: k.Key, Limit: k.Limit, Seq: seq})
		}
	}
}

// settleSlots applies what an accepted entry e of the run does to its slots (the rules
// above; the terminal case is settled at the batch's commit, drainEnded).
func (tx *applyBatch) settleSlots(c *cachedRun, e *Entry) {
	r := c.run
	if len(r.Slots) == 0 && len(r.Draining) == 0 {
		return
	}
	before := len(r.Slots) + len(r.Draining)
	switch e.Kind {
	case KindClaim:
		r.Draining = nil
	case KindCommit, KindFail:
		if st := c.steps[e.Step]; st != nil && (st.Status == StepSucceeded || st.Status == StepSkipped || st.Status == StepFailed) {
			r.Slots = slices.DeleteFunc(r.Slots, func(s StepSlot) bool { return s.Step == e.Step })
		}
	case KindComplete, KindPark, KindRequeue:
		r.Slots = nil
	case KindRetry:
		c.drain(tx.s.hooks.NoStepDrain)
	}
	if len(r.Slots)+len(r.Draining) != before {
		c.runDirty = true
	}
}

// drainEnded moves the slots of a run that ended by someone other than its owner to
// Draining (the owner's own end gave them back already).
func (c *cachedRun) drainEnded(noDrain bool) {
	if c.run.Status.Terminal() && len(c.run.Slots) > 0 {
		c.drain(noDrain)
	}
}

// drain moves the run's slots to Draining; noDrain is the control (Hooks.NoStepDrain):
// they are given back at once, as if the owner's processes had ended.
func (c *cachedRun) drain(noDrain bool) {
	r := c.run
	if !noDrain {
		r.Draining = append(r.Draining, r.Slots...)
	}
	r.Slots = nil
	c.runDirty = true
}

// SlotWaiter is a run parked for its step's slots: the leader grants them in park order.
type SlotWaiter struct {
	Run     string
	Step    string
	ParkSeq uint64
	Keys    []SlotKey
	Since   time.Time
}

// SlotWaiters are the runs parked on a concurrency wait, in park order (ParkSeq).
func (s *Store) SlotWaiters() []SlotWaiter {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	out := make([]SlotWaiter, 0, len(s.queue.slotWaits))
	for _, w := range s.queue.slotWaits {
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b SlotWaiter) int {
		if c := cmp.Compare(a.ParkSeq, b.ParkSeq); c != 0 {
			return c
		}
		return cmp.Compare(a.Run, b.Run)
	})
	return out
}

// SlotHolders are the runs not ended that hold or drain step slots, sorted.
func (s *Store) SlotHolders() []string {
	s.queue.mu.Lock()
	defer s.queue.mu.Unlock()
	ids := make([]string, 0, len(s.queue.slotted))
	for id := range s.queue.slotted {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// slotted is a run not ended that holds or drains step slots: its workflow and the keys
// its slots count against.
type slotted struct {
	workflow string
	keys     []SlotKey
	holds    bool // it holds granted slots (Run.Slots), not only draining ones
}

// SlotKeysOf are the keys run's step slots count against (Run.SlotKeys): from memory for
// a run not ended, from its record for one that ended (which the leader counts only
// while its lease may live: a few).
func (s *Store) SlotKeysOf(run string) []SlotKey {
	q := &s.queue
	q.mu.Lock()
	rec, holds := q.slotted[run]
	_, held := q.held[run]
	_, parked := q.parked[run]
	_, queued := q.seq[run]
	q.mu.Unlock()
	switch {
	case holds:
		return rec.keys
	case held || parked || queued:
		return nil
	}
	r, err := s.Run(run)
	if err != nil {
		return nil
	}
	return r.SlotKeys()
}

// noteSlots keeps the queue's step slot indexes after r changed (lock held).
func (q *runQueue) noteSlots(r *Run) {
	if !r.Status.Terminal() && len(r.Slots)+len(r.Draining) > 0 {
		q.slotted[r.ID] = slotted{workflow: r.Workflow, keys: r.SlotKeys(), holds: len(r.Slots) > 0}
	} else {
		delete(q.slotted, r.ID)
	}
	if r.Status == StatusWaiting && r.Waiting != nil && r.Waiting.Kind == WaitConcurrency {
		q.slotWaits[r.ID] = SlotWaiter{Run: r.ID, Step: r.Waiting.Step, ParkSeq: r.Waiting.Seq, Keys: slices.Clone(r.Waiting.Keys), Since: r.Waiting.Since}
	} else {
		delete(q.slotWaits, r.ID)
	}
}
