package leader

import (
	"sync/atomic"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// Admission bounds how many runs hold an epoch. A run holding one is either running
// (it took one of a worker's slots) or assigned and waiting for a worker (its task is
// queued). Workers only claim with a free slot, so running runs are bounded by the
// cluster's slots; the leader bounds the others: it keeps at most QueueAhead runs
// assigned and unclaimed, and assigns more as workers claim them. So
//
//	runs holding an epoch <= the workers' slots + QueueAhead (+ runs being reclaimed)
//
// without the leader knowing how many nodes and slots there are: demand comes from the
// workers taking tasks. Every other pending run waits in the state, without an epoch or
// a task, and is assigned oldest submission first (docs/operations.md, "Backlogs").
// Before this, the leader assigned every pending run at once: ~500k tasks filled the
// embedded server's memory budget, which the leases share, and every lease renewal then
// failed.
//
// The assigner and the API's short path (a run started on the leader gets its first
// assign in its submit's message) share one Admission.
type Admission struct {
	queueAhead int
	hooks      *testhooks.Hooks
	// admitting counts assigns written and not yet applied: the state counts them
	// from then on.
	admitting atomic.Int64
	// backlogged: the assigner's last pass left runs waiting for room; queuedLeft: how
	// many runs needed an assign when it ended (those its limits held back, or none).
	backlogged atomic.Bool
	queuedLeft atomic.Int64
}

// NewAdmission keeps queueAhead runs assigned ahead of the workers. hooks may be nil.
func NewAdmission(queueAhead int, hooks *testhooks.Hooks) *Admission {
	return &Admission{queueAhead: queueAhead, hooks: testhooks.OrProduction(hooks)}
}

// QueueAhead is the default bound for a node of workers slots: twice its slots, at
// least 8; enough to keep workers that free a slot fed while the next assigns are
// written, and small enough that tasks never weigh on the memory the leases need.
func QueueAhead(workers int) int { return max(2*workers, 8) }

func (a *Admission) ahead() int {
	if n := a.hooks.QueueAheadN.Load(); n > 0 {
		return int(n)
	}
	return a.queueAhead
}

// Room is how many more runs may be assigned now, given how many are assigned and
// unclaimed in the state.
func (a *Admission) Room(assigned int) int {
	if a.hooks.NoAdmission.Load() {
		return 1 << 30
	}
	return Room(a.ahead(), assigned, int(a.admitting.Load()))
}

// Room is the admission rule: the runs kept ahead, less those assigned and unclaimed
// and those whose assign is written but not yet applied.
func Room(queueAhead, assigned, admitting int) int { return queueAhead - assigned - admitting }

// Writing counts n assigns as admitted until done is called (once they were applied
// or failed).
func (a *Admission) Writing(n int) (done func()) {
	a.admitting.Add(int64(n))
	return func() { a.admitting.Add(-int64(n)) }
}

// PassEnded records what the assigner's last pass left: whether runs wait for room
// (backlogged), and how many runs needed an assign when it ended (queued).
func (a *Admission) PassEnded(backlogged bool, queued int) {
	a.queuedLeft.Store(int64(queued))
	a.backlogged.Store(backlogged)
}

// Admit reserves room for the first assign of a run started on the leader (the API's
// short path), which may not jump the queue: it is refused while older runs wait for
// room. Runs held back by their workflow's concurrency limit do not wait for room and do
// not close the short path to others. Nor may it pass runs submitted since the last
// pass, which no pass has looked at yet: while queued (the runs needing an assign now)
// is above what the last pass left, it is refused too (on a busy node the pass lags the
// submits; a run started then went ahead of a hundred that waited: TestAdmissionBoundsEpochs).
// Admitted releases the reservation.
func (a *Admission) Admit(assigned, queued func() int) bool {
	if a.hooks.NoAdmission.Load() {
		a.admitting.Add(1)
		return true
	}
	if (a.backlogged.Load() || int64(queued()) > a.queuedLeft.Load()) && !a.hooks.AdmitPastWaiting.Load() {
		return false
	}
	for {
		n := a.admitting.Load()
		if Room(a.ahead(), assigned(), int(n)) <= 0 {
			return false
		}
		if a.admitting.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Admitted releases what Admit reserved.
func (a *Admission) Admitted() { a.admitting.Add(-1) }

// Backlogged says whether the assigner's last pass left runs waiting for room.
func (a *Admission) Backlogged() bool { return a.backlogged.Load() }
