package leader

import (
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// Live says whether a run has a live lease, and for which epoch (the lease watcher).
type Live func(run string) (epoch int64, ok bool)

// Reclaim is a run whose epoch should be replaced by a new one: its lease ended.
type Reclaim struct {
	Run   string
	Epoch int64 // the epoch whose lease ended
	// Owner is the holder of the lease that lapsed (a lapse event's); empty when a
	// reconcile found no live lease of the epoch at all.
	Owner  string
	Reason string // checkpoint.ReasonLeaseExpired or ReasonReconciled
}

// Requeue is an assigned epoch whose task should be queued again.
type Requeue struct {
	Run   string
	Epoch int64
}

// ReconcilePlan is what one reconcile pass decided.
type ReconcilePlan struct {
	// Announce are the dead-lettered runs whose DLQ notice is published again (the DLQ
	// stream deduplicates them).
	Announce []string
	// Reclaim are running runs without a live lease of their epoch.
	Reclaim []Reclaim
	// Requeue are runs assigned an epoch that no worker claimed within a TTL: their
	// task may be lost. Queueing it again is safe: an epoch is claimed once, ever.
	Requeue []Requeue
}

// Reconciler decides, pass after pass, which runs the state calls running have no
// owner: every running run must have a live lease of its epoch. It remembers, between
// passes, the runs it found without one (suspects).
type Reconciler struct {
	// TTL is the lease TTL.
	TTL time.Duration
	// suspects are running runs a pass found without a live lease although the log
	// changed them less than a TTL ago, with when it first did. They are reclaimed once
	// that has lasted a TTL: the lease watcher can lag behind the log (a run claimed a
	// moment ago, after a NATS server was lost and the streams recovered), and a reclaim
	// costs the run a counted epoch change. Runs quiet for a TTL by the log's clock are
	// reclaimed at once. (A wrong wall clock on a writer can only make a reclaim come a
	// TTL later, or as early as before this rule.)
	suspects map[string]suspect
}

type suspect struct {
	epoch int64
	since time.Time
}

// Pass is one reconcile pass at now.
func (c *Reconciler) Pass(st State, live Live, now time.Time) (ReconcilePlan, error) {
	var p ReconcilePlan
	err := st.EachRun(checkpoint.ListOptions{Status: checkpoint.StatusDeadLettered}, func(r *checkpoint.Run) bool {
		p.Announce = append(p.Announce, r.ID)
		return true
	})
	if err != nil {
		return p, err
	}
	if c.suspects == nil {
		c.suspects = map[string]suspect{}
	}
	seen := map[string]bool{}
	err = st.EachRun(checkpoint.ListOptions{Status: checkpoint.StatusRunning}, func(r *checkpoint.Run) bool {
		seen[r.ID] = true
		if ep, ok := live(r.ID); ok && ep == r.Epoch {
			delete(c.suspects, r.ID)
			return true
		}
		sus, known := c.suspects[r.ID]
		known = known && sus.epoch == r.Epoch
		switch {
		case now.Sub(r.UpdatedAt) >= c.TTL, known && now.Sub(sus.since) >= c.TTL:
			// Quiet for a TTL by the log's clock, or lease-less for a TTL by ours.
			delete(c.suspects, r.ID)
			p.Reclaim = append(p.Reclaim, Reclaim{Run: r.ID, Epoch: r.Epoch, Reason: checkpoint.ReasonReconciled})
		case !known:
			c.suspects[r.ID] = suspect{epoch: r.Epoch, since: now}
		}
		return true
	})
	if err != nil {
		return p, err
	}
	for id := range c.suspects {
		if !seen[id] {
			delete(c.suspects, id) // finished, or moved on
		}
	}
	// Only the assigned runs, not every pending one: with a backlog of a million runs
	// waiting for admission, a scan of them all every pass would starve running runs.
	for _, id := range st.AssignedRuns() {
		r, err := st.Run(id)
		if err != nil || r.Status != checkpoint.StatusPending {
			continue
		}
		if !r.NeedsAssign() && r.Epoch > 0 && now.Sub(r.UpdatedAt) > c.TTL {
			p.Requeue = append(p.Requeue, Requeue{Run: r.ID, Epoch: r.Epoch})
		}
	}
	return p, nil
}

// Suspects are the runs the last pass found without a live lease and did not reclaim
// yet, with when each was first found (for transcripts and logs).
func (c *Reconciler) Suspects() map[string]time.Time {
	out := make(map[string]time.Time, len(c.suspects))
	for id, s := range c.suspects {
		out[id] = s.since
	}
	return out
}

// Reclaimable says whether a reclaim still applies: the run is running at rc's epoch
// (else it finished, was handed back, or moved on already) and, for a lapsed lease, its
// owner is that lease's holder.
//
// The owner matters when the lapse is handled late (a watch that lags, a leader that was
// paused): a worker that took the lease of an epoch and never claimed it (it died, or was
// cut off, before its claim) lets the lease lapse; the task comes back, another worker
// takes a new lease of the same epoch and claims it; the first lease's lapse, handled
// after that claim was applied, must not take the epoch from its live owner, whose step
// would then do its side effect while the run is at a newer epoch (invariant 8). An
// epoch's owner never changes once the log has one (the claim-once rule), so the lapsed
// lease's holder owning the run means that lease was the epoch's own. The deterministic
// simulation found this (engine/internal/sim, seed 192 before the fix; docs/testing.md).
func Reclaimable(r *checkpoint.Run, rc Reclaim) bool {
	return r.Status == checkpoint.StatusRunning && r.Epoch == rc.Epoch && (rc.Owner == "" || r.Owner == rc.Owner)
}

// LockDelay makes the leader wait Delay after a lease ended before it reclaims the run
// (Chubby's remedy for downstream systems that cannot check fencing tokens: the old
// holder's in-flight writes land before anyone starts again). Zero: no wait.
type LockDelay struct {
	Delay time.Duration
	due   map[string]time.Time
}

// Due says whether run may be reclaimed at now, and whether this is the first time it
// was asked (the delay starts then).
func (d *LockDelay) Due(run string, now time.Time) (due, first bool) {
	if d.Delay <= 0 {
		return true, true
	}
	if d.due == nil {
		d.due = map[string]time.Time{}
	}
	at, waiting := d.due[run]
	if !waiting {
		d.due[run] = now.Add(d.Delay)
		return false, true
	}
	if now.Before(at) {
		return false, false
	}
	delete(d.due, run)
	return true, false
}
