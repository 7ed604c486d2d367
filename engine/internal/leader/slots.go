package leader

import (
	"context"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/logstream"
	"github.com/flowrun/flow/workflow"
)

// Step slots (checkpoint/slots.go): a run whose step has concurrency keys without room
// is parked on a wait of kind concurrency; the leader grants the slots by writing that
// park's wake when every key has room. A grant is counted like an admission of a run
// with keys (keys.go): against the same counts, made in the same pass, so that a step's
// key and a workflow's key of the same text share one limit, and a slot is free only
// when the run that held it can no longer be running the step (its owner gave it back
// after its processes ended, or its lease is gone).

// PlanGrants picks, in park order, the waiters whose every key has room under counts,
// and counts them in (counts is changed). A waiter whose key is full is passed over
// (the next may have other keys), up to MaxKeyPassOver of them a pass.
func PlanGrants(waiters []checkpoint.SlotWaiter, counts KeyCounts) []checkpoint.SlotWaiter {
	var grants []checkpoint.SlotWaiter
	passedOver := 0
	for _, w := range waiters {
		if !keysFit(counts, slotKeys(w.Keys)) {
			if passedOver++; passedOver >= MaxKeyPassOver {
				break
			}
			continue
		}
		for _, k := range w.Keys {
			counts[k.Key]++
		}
		grants = append(grants, w)
	}
	return grants
}

func slotKeys(keys []checkpoint.SlotKey) []workflow.KeyLimit {
	out := make([]workflow.KeyLimit, len(keys))
	for i, k := range keys {
		out[i] = workflow.KeyLimit{Key: k.Key, Limit: k.Limit}
	}
	return out
}

// GrantEntry is the wake that grants a parked step its slots.
func GrantEntry(w checkpoint.SlotWaiter) checkpoint.Entry {
	return checkpoint.Entry{Kind: checkpoint.KindWake, Run: w.Run, Step: w.Step, Item: checkpoint.ItemWhole, ParkSeq: w.ParkSeq}
}

// grantSlots writes the grants a pass can make; count gives the pass's counts (asked
// once a pass, shared with PlanAssign). Its wakes count as this leader's own writes:
// no count is given until the state has applied them (SlotView.Unapplied).
func (t *termServices) grantSlots(ctx context.Context, count func() (KeyCounts, bool)) {
	waiters := t.s.cfg.State.SlotWaiters()
	if len(waiters) == 0 {
		return
	}
	counts, ok := count()
	if !ok {
		return
	}
	grants := PlanGrants(waiters, counts)
	for len(grants) > 0 && ctx.Err() == nil {
		n := min(len(grants), logstream.DefaultMaxBatchEntries)
		entries := make([]checkpoint.Entry, n)
		for i, g := range grants[:n] {
			entries[i] = GrantEntry(g)
		}
		grants = grants[n:]
		written := t.write(ctx, entries...)
		if written == nil {
			return
		}
		for i, err := range written.Results(ctx) {
			if err != nil {
				t.s.log.Info("slot grant not applied", "run", entries[i].Run, "step", entries[i].Step, "err", err)
			}
		}
		if seq := written.Seq(); seq > t.wrote {
			t.wrote = seq
		}
	}
}
