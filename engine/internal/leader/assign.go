package leader

import (
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/workflow"
)

// PlanOptions are what PlanAssign reads besides the state.
type PlanOptions struct {
	// Slots counts the concurrency keys' slots (keys.go); nil: runs with keys wait.
	Slots func() (KeyCounts, bool)
	// Taken, if not nil, is told each run taken with keys, and its keys.
	Taken func(run string, keys []workflow.KeyLimit)
	// Placeable says whether a live node has all of a run's worker labels (nil: every
	// run is placeable).
	Placeable func(labels []string) bool
	// Now and Aging order the queued runs: by priority raised by one per Aging waited
	// (checkpoint.Effective; Aging 0: by priority alone), then oldest first.
	Now   time.Time
	Aging time.Duration
}

// PlanAssign picks the runs to assign now: those that need an assign
// (checkpoint.Run.NeedsAssign), in order of effective priority at opts.Now (a run's
// priority raised by one for each opts.Aging it has waited), then oldest submission
// first, at most room of them. A run of a
// workflow with a concurrency limit is taken only while fewer of that workflow's runs
// hold an epoch, counting those taken in this pass; once a workflow is at its limit, its
// later runs are passed over without being read, so that a million runs held back by a
// limit cost a pass one read. Runs passed over for their limit do not use room.
//
// A run with concurrency keys (keys.go) is taken only while each of its keys has room
// under the counts slots gives, counting those taken in this pass; slots is asked once,
// when the first such run is met, and when it cannot count (false) every run with keys
// waits for a later pass. A run whose key is full is passed over alone (the next run of
// its workflow may have another key), up to MaxKeyPassOver of one workflow per pass:
// the rest of that workflow waits behind them, so a million runs waiting for one key
// cost a pass a bounded number of reads. opts.Taken, if not nil, is told each run
// taken with keys, and its keys.
//
// A run whose workflow names worker labels (runs_on: workflow.Workflow.Labels) is taken
// only when opts.Placeable says a live node has them all (nil: every run is): the
// rest wait queued, without an epoch, as a run whose key is full does (and are passed
// over within the same bound), and are taken in a later pass once such a node reports.
func PlanAssign(st State, specs Specs, room int, opts PlanOptions) ([]*checkpoint.Run, error) {
	slots, taken, placeable := opts.Slots, opts.Taken, opts.Placeable
	if room <= 0 {
		return nil, nil
	}
	var active map[string]int // runs per workflow holding an epoch
	var counts KeyCounts
	asked, canCount := false, false
	passedOver := map[string]int{}
	var plan []*checkpoint.Run
	err := st.EachQueuedAt(opts.Now, opts.Aging, func(r *checkpoint.Run) checkpoint.QueueVerdict {
		if limit := concurrency(specs, r); limit > 0 {
			if active == nil {
				active = st.HeldByWorkflow()
			}
			if active[r.Workflow] >= limit {
				return checkpoint.QueueSkipWorkflow
			}
		}
		if placeable != nil {
			if labels := RunLabels(specs, r); len(labels) > 0 && !placeable(labels) {
				passedOver[r.Workflow]++
				if passedOver[r.Workflow] >= MaxKeyPassOver {
					return checkpoint.QueueSkipWorkflow
				}
				return checkpoint.QueueNext
			}
		}
		keys := RunKeys(specs, r)
		if len(r.Slots) > 0 {
			// Woken with its step's slots: it kept its keys' slots (it is among the
			// holders, checkpoint.Store.KeyHolders), so it is counted already and
			// waits for none of them.
			if taken != nil && len(keys) > 0 {
				taken(r.ID, keys)
			}
			keys = nil
		}
		if len(keys) > 0 {
			if !asked && slots != nil {
				asked = true
				counts, canCount = slots()
			}
			if !canCount || !keysFit(counts, keys) {
				passedOver[r.Workflow]++
				if passedOver[r.Workflow] >= MaxKeyPassOver {
					return checkpoint.QueueSkipWorkflow
				}
				return checkpoint.QueueNext
			}
			for _, k := range keys {
				counts[k.Key]++
			}
			if taken != nil {
				taken(r.ID, keys)
			}
		}
		if active != nil {
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

// MaxKeyPassOver is how many runs of one workflow a pass passes over for a full key
// before it leaves that workflow's later runs for the next pass.
const MaxKeyPassOver = 1024

// concurrency is the run's workflow's limit (0: none, or its definition unreadable:
// such a run is assigned and fails on its worker, where the error is recorded).
func concurrency(specs Specs, r *checkpoint.Run) int {
	wf, err := specs.OfRun(r)
	if err != nil {
		return 0
	}
	return wf.Concurrency
}

// RunLabels are the worker labels a node needs to run r (its workflow's and steps'
// runs_on; nil: any node, or its definition unreadable: such a run fails on whichever
// worker takes it, where the error is recorded).
func RunLabels(specs Specs, r *checkpoint.Run) []string {
	wf, err := specs.OfRun(r)
	if err != nil {
		return nil
	}
	return wf.Labels()
}

// AssignEntry is the entry that gives a run its next epoch (replacing its current one,
// which the log checks), for a reason (empty: assigned).
func AssignEntry(run string, current int64, reason string) checkpoint.Entry {
	return checkpoint.Entry{Kind: checkpoint.KindAssign, Run: run, Epoch: current, Reason: reason}
}
