package engine

// Admission: how many runs the leader gives an epoch. A run holding an epoch is either
// running (it took one of a worker's slots) or assigned and waiting for a worker (its
// task is in FLOW_TASKS). Workers only claim with a free slot, so running runs are
// bounded by the cluster's slots; the leader bounds the others: it keeps at most
// queueAhead runs assigned and unclaimed, and assigns more as workers claim them (the
// scheduler wakes on every applied message). So
//
//	runs holding an epoch <= the workers' slots + queueAhead (+ runs being reclaimed)
//
// without the leader knowing how many nodes and slots there are: demand comes from the
// workers taking tasks. Every other pending run waits in the state, without an epoch or
// a task, and is assigned oldest submission first (docs/operations.md). Before this, the
// leader assigned every pending run at once: ~500k tasks filled the embedded server's
// memory budget, which the leases share, and every lease renewal then failed.

// queueAhead is how many runs the leader keeps assigned and waiting for a worker: twice
// this node's worker slots (at least 8), enough to keep workers that free a slot fed
// while the next assigns are written, and small enough that tasks never weigh on the
// memory the leases need.
func (e *Engine) queueAhead() int {
	if n := e.hooks.QueueAheadN.Load(); n > 0 {
		return int(n)
	}
	return max(2*e.cfg.Workers, 8)
}

// admissionRoom is how many more runs the leader may assign now.
func (e *Engine) admissionRoom() int {
	if e.hooks.NoAdmission.Load() {
		return 1 << 30
	}
	assigned, _ := e.store.Held()
	return e.queueAhead() - assigned - int(e.admitting.Load())
}

// admit reserves room for the first assign of a run started on the leader (StartRun's
// short path), which may not jump the queue: it is refused while older runs wait for
// room (the scheduler's last pass left some). Runs held back by their workflow's
// concurrency limit do not wait for room and do not close the short path to others.
// admitted releases the reservation once the assign was applied (or failed).
func (e *Engine) admit() bool {
	if e.hooks.NoAdmission.Load() {
		e.admitting.Add(1)
		return true
	}
	if e.backlogged.Load() && !e.hooks.AdmitPastWaiting.Load() {
		return false
	}
	for {
		n := e.admitting.Load()
		assigned, _ := e.store.Held()
		if e.queueAhead()-assigned-int(n) <= 0 {
			return false
		}
		if e.admitting.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (e *Engine) admitted() { e.admitting.Add(-1) }
