package leader

import "github.com/flowrun/flow/checkpoint"

// PlanAssign picks the runs to assign now: those that need an assign
// (checkpoint.Run.NeedsAssign), oldest submission first, at most room of them. A run of a
// workflow with a concurrency limit is taken only while fewer of that workflow's runs
// hold an epoch, counting those taken in this pass; once a workflow is at its limit, its
// later runs are passed over without being read, so that a million runs held back by a
// limit cost a pass one read. Runs passed over for their limit do not use room.
func PlanAssign(st State, specs Specs, room int) ([]*checkpoint.Run, error) {
	if room <= 0 {
		return nil, nil
	}
	var active map[string]int // runs per workflow holding an epoch
	var plan []*checkpoint.Run
	err := st.EachQueued(func(r *checkpoint.Run) checkpoint.QueueVerdict {
		if limit := concurrency(specs, r); limit > 0 {
			if active == nil {
				active = st.HeldByWorkflow()
			}
			if active[r.Workflow] >= limit {
				return checkpoint.QueueSkipWorkflow
			}
			active[r.Workflow]++
		}
		plan = append(plan, r)
		if len(plan) >= room {
			return checkpoint.QueueStop
		}
		return checkpoint.QueueNext
	})
	return plan, err
}

// concurrency is the run's workflow's limit (0: none, or its definition unreadable:
// such a run is assigned and fails on its worker, where the error is recorded).
func concurrency(specs Specs, r *checkpoint.Run) int {
	wf, err := specs.OfRun(r)
	if err != nil {
		return 0
	}
	return wf.Concurrency
}

// AssignEntry is the entry that gives a run its next epoch (replacing its current one,
// which the log checks), for a reason (empty: assigned).
func AssignEntry(run string, current int64, reason string) checkpoint.Entry {
	return checkpoint.Entry{Kind: checkpoint.KindAssign, Run: run, Epoch: current, Reason: reason}
}
