package leader

import (
	"context"
	"encoding/json"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// Concurrency keys (`concurrency: {key, limit}`, workflow/concurrency.go): at most limit
// runs whose key renders alike hold a slot at once, in real time and not only in the
// books. A slot is not a new record: it is what the state already says (docs/checkpoint.md
// "Concurrency keys"):
//
//   - a run takes its slots with its assign (written under the leader's term; PlanAssign
//     admits it only while its keys have room), and holds them while it holds an epoch
//     (assigned or running) or is parked in a wait;
//   - it gives them back with the entry that ends, parks-and-is-requeued or hands back
//     the run: from its owner that entry is epoch-fenced like a commit, so a zombie that
//     lost the run cannot release what it no longer holds;
//   - and the leader counts a slot as held until the run's last owner can no longer be
//     running a step: while the run's lease is live in the leader's watch, and, after
//     the state stopped counting the run (checkpoint.Store.Released), until the watch is
//     caught up as of a moment after the leader saw that. A run ended by someone other than its owner (a cancel,
//     a dead-lettering) while its owner is paused keeps its slot until the owner's lease
//     lapses, which is after the owner's trust deadline, when containment has stopped
//     its step processes. So the next run of the key starts after the last one's steps
//     stopped, not merely after its books closed.
//
// KeyCounts and PlanAssign are the decision; slotCounter is the leader's memory of
// what it counted (it lives for one term).

// noSlotDrain is the slot drain's control for a process (-ldflags "-X
// github.com/flowrun/flow/engine/internal/leader.noSlotDrain=1"; empty in every release
// build): a slot is free as soon as the state stops counting its run, whatever the run's
// lease (Hooks.NoSlotDrain for in-process tests).
var noSlotDrain string

// noTermTail is the control of a new term's catch-up (-ldflags "-X
// github.com/flowrun/flow/engine/internal/leader.noTermTail=1"; empty in every release
// build): the leader counts slots without first applying what the last leader wrote
// (Hooks.NoTermTail for in-process tests).
var noTermTail string

// KeyCounts are the slots held per rendered key when a pass begins.
type KeyCounts map[string]int

// SlotView is what one count reads: the runs the state says hold slots
// (checkpoint.Store.KeyHolders), the runs that stopped holding since the last count
// (checkpoint.Store.Released: complete unless more were released than the state keeps),
// the runs whose lease the watch believes live, and the time as of which the watch is
// caught up.
type SlotView struct {
	Holders          []string
	Released         []string
	ReleasedComplete bool
	Live             []string
	AsOf             time.Time
	Now              time.Time
	// Unapplied: the state has not applied the log as far as this term relies on: the
	// log's end when the term began (the last leader's final assigns), and this
	// leader's own assigns. Their runs still look queued, and a run queued ahead of
	// them (a retry keeps its first place) would be admitted beside them; no count is
	// given until it has.
	Unapplied bool
	// NoDrain is the control: the state's holders alone are counted.
	NoDrain bool
	// StepKeys, if not nil, gives the keys a run's step slots count against, read
	// afresh at each count: a step's owner gives its slot back while the run goes on.
	// StepHolders are the runs not ended that hold or drain step slots
	// (checkpoint.Store.SlotHolders): counted for those alone when nothing else counts
	// them (a run woken with its slots, queued for its next epoch, holds its step's
	// slots but not its workflow's keys, which it must be admitted with again).
	StepKeys    func(run string) []workflow.KeyLimit
	StepHolders []string
}

// slotCounter remembers, across the passes of one term, the runs that stopped holding
// by the state and when it saw them do so (ending), each counted run's rendered keys,
// and a barrier: no count is given until the watch is caught up as of after it (the
// term's start, or a moment when releases were lost). A run released before the barrier
// wrote its lease before it, so a watch caught up past the barrier has that lease.
type slotCounter struct {
	barrier time.Time
	ending  map[string]time.Time
	keys    map[string][]workflow.KeyLimit // run -> its keys (nil: none)
}

func newSlotCounter(termStart time.Time) *slotCounter {
	return &slotCounter{barrier: termStart, ending: map[string]time.Time{}, keys: map[string][]workflow.KeyLimit{}}
}

// Count gives the slots held per key, or false when it cannot be known yet (the watch
// not caught up past the barrier, or this leader's own assigns unapplied): then no run
// with keys is admitted. keysOf renders a run's keys (nil: none); it is asked once per
// run while the run is counted.
//
// A run counts while the state says it holds (Holders), while the watch believes its
// lease live, and, from the count that saw it released, until the watch is caught up as
// of after that count: its lease was written before its release was applied here, so
// such a watch has it in Live if it is still held.
func (c *slotCounter) Count(v SlotView, keysOf func(run string) []workflow.KeyLimit) (KeyCounts, bool) {
	if v.NoDrain { // the control: the state's holders alone, and nothing remembered
		counts := KeyCounts{}
		counted := map[string]bool{}
		for _, id := range v.Holders {
			counted[id] = true
			for _, k := range keysOf(id) {
				counts[k.Key]++
			}
			v.countSteps(counts, id)
		}
		v.countStepHolders(counts, counted)
		return counts, true
	}
	if !v.ReleasedComplete {
		clear(c.ending)
		if v.Now.After(c.barrier) {
			c.barrier = v.Now
		}
	}
	for _, id := range v.Released {
		if _, ok := c.ending[id]; !ok {
			c.ending[id] = v.Now
		}
	}
	if v.Unapplied || !v.AsOf.After(c.barrier) {
		return nil, false
	}
	counted := map[string]bool{}
	for _, id := range v.Holders {
		counted[id] = true
	}
	for _, id := range v.Live {
		counted[id] = true
	}
	for id, at := range c.ending {
		if v.AsOf.After(at) { // the watch has every lease written before the release
			delete(c.ending, id)
			continue
		}
		counted[id] = true
	}
	counts := KeyCounts{}
	for id := range counted {
		kl, ok := c.keys[id]
		if !ok {
			kl = keysOf(id)
			c.keys[id] = kl
		}
		for _, k := range kl {
			counts[k.Key]++
		}
		v.countSteps(counts, id)
	}
	v.countStepHolders(counts, counted)
	for id := range c.keys {
		if !counted[id] {
			delete(c.keys, id)
		}
	}
	return counts, true
}

// countSteps counts run's step slots.
func (v SlotView) countSteps(counts KeyCounts, run string) {
	if v.StepKeys == nil {
		return
	}
	for _, k := range v.StepKeys(run) {
		counts[k.Key]++
	}
}

// countStepHolders counts the step slots of the step holders not counted already.
func (v SlotView) countStepHolders(counts KeyCounts, counted map[string]bool) {
	for _, id := range v.StepHolders {
		if !counted[id] {
			v.countSteps(counts, id)
		}
	}
}

// admitted records the keys a pass admitted run with (fresh: its inputs may have changed
// since it last held a slot).
func (c *slotCounter) admitted(run string, kl []workflow.KeyLimit) { c.keys[run] = kl }

// RunKeys renders run r's concurrency keys under its workflow version (nil: it has none).
// A key that does not render is counted under workflow.UnrenderedKey: such runs wait
// for one another instead of running unlimited.
func RunKeys(specs Specs, r *checkpoint.Run) []workflow.KeyLimit {
	wf, err := specs.OfRun(r)
	if err != nil || len(wf.ConcurrencyKeys) == 0 {
		return nil
	}
	var inputs map[string]any
	_ = json.Unmarshal(r.Inputs, &inputs)
	keys, err := wf.Keys(inputs)
	if err == nil {
		return keys
	}
	out := make([]workflow.KeyLimit, len(wf.ConcurrencyKeys))
	for i, kl := range wf.ConcurrencyKeys {
		out[i] = workflow.KeyLimit{Key: workflow.UnrenderedKey(kl.Key), Limit: kl.Limit}
	}
	return out
}

// keysFit reports whether every key of a run has room under counts.
func keysFit(counts KeyCounts, keys []workflow.KeyLimit) bool {
	for _, k := range keys {
		if counts[k.Key] >= k.Limit {
			return false
		}
	}
	return true
}

// readTail reads the log's last sequence once a term, until it has: a new leader's
// state may not have applied the last leader's final assigns yet (their runs still look
// queued), and counts no slot before it has (keys.go, SlotView.Unapplied).
func (t *termServices) readTail(ctx context.Context) {
	if t.tailRead || noTermTail != "" || t.s.hooks.NoTermTail.Load() {
		return
	}
	last, err := t.s.cfg.Log.LastSeq(ctx)
	if err != nil {
		t.s.log.Warn("read the log's last sequence (runs with concurrency keys wait)", "err", err)
		return
	}
	t.wrote, t.tailRead = max(t.wrote, last), true
}

// countSlots counts the concurrency keys' slots for a pass (keys.go).
func (t *termServices) countSlots() (KeyCounts, bool) {
	s := t.s
	released, next, complete := s.cfg.State.Released(t.releasedAt)
	t.releasedAt = next
	v := SlotView{Holders: s.cfg.State.KeyHolders(nil), Released: released, ReleasedComplete: complete, Live: t.watcher.LiveRuns(),
		AsOf: t.watcher.CaughtUpAsOf(), Now: s.clock.Now(), Unapplied: !t.tailRead && noTermTail == "" && !s.hooks.NoTermTail.Load() || s.cfg.State.Applied() < t.wrote,
		NoDrain:  s.hooks.NoSlotDrain.Load() || noSlotDrain != "",
		StepKeys: func(id string) []workflow.KeyLimit { return slotKeys(s.cfg.State.SlotKeysOf(id)) }, StepHolders: s.cfg.State.SlotHolders()}
	return t.slots.Count(v, func(id string) []workflow.KeyLimit {
		r, err := s.cfg.State.Run(id)
		if err != nil {
			return nil
		}
		return RunKeys(s.cfg.Specs, r)
	})
}
