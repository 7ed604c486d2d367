package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine/internal/leader"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/workflow"
)

// Worker labels (flowd --labels; workflow/labels.go): a run whose workflow needs labels
// is assigned by the leader only while a live node reports them all (leader.PlanAssign's
// placeable), and is claimed only by a worker that has them (worker.Pool). Until then it
// is pending without a worker, shown waiting of kind label with the labels no live node
// has.

// labelViewAge is how long a read of the live nodes' labels is used before it is read
// again: a node that joins with a label is seen within it (and the leader's next pass).
const labelViewAge = time.Second

// labelView is the live nodes' labels as this node last read them from the nodes bucket
// (nodes.Live), read again when older than labelViewAge. It reads only when asked about
// a run that needs labels: a cluster without runs_on never reads it.
type labelView struct {
	e  *Engine
	mu sync.Mutex
	at time.Time
	ok bool
	// sets are the labels of each live node.
	sets [][]string
	// waits are the steps the live nodes reported waiting for a rate's moment, oldest
	// first.
	waits []rateWaitAt
}

// rateWaitAt is a rate wait as a node reported it.
type rateWaitAt struct {
	nodes.RateWait
	Node string
}

// live are the live nodes' label sets (ok false: never read, or the bucket did not
// answer: then no run that needs labels is placeable, and such runs wait).
func (v *labelView) live() ([][]string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.e.cfg.Clock.Now()
	if v.ok && now.Sub(v.at) < labelViewAge && now.Sub(v.at) >= 0 {
		return v.sets, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	live, err := nodes.Live(ctx, v.e.ports.Nodes)
	if err != nil {
		return v.sets, v.ok
	}
	sets := make([][]string, 0, len(live))
	var waits []rateWaitAt
	for node, r := range live {
		sets = append(sets, r.Labels)
		for _, w := range r.RateWaits {
			waits = append(waits, rateWaitAt{w, node})
		}
	}
	slices.SortFunc(waits, func(a, b rateWaitAt) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.Run+"/"+a.Step, b.Run+"/"+b.Step)
	})
	v.sets, v.waits, v.at, v.ok = sets, waits, now, true
	return sets, true
}

// placeable says whether a live node has every label of need (leader.Config.Placeable).
func (v *labelView) placeable(need []string) bool {
	return v.unplaced(need) == nil
}

// unplaced are the labels of need the live node that has most of them lacks (nil: a live
// node has them all), for the waiting run's display.
func (v *labelView) unplaced(need []string) []string {
	if len(need) == 0 {
		return nil
	}
	sets, _ := v.live()
	best := need
	for _, have := range sets {
		m := workflow.Missing(need, have)
		if len(m) == 0 {
			return nil
		}
		if len(m) < len(best) {
			best = m
		}
	}
	return best
}

// labelWaiting is what a run without a worker waits for when no live node has its
// labels: kind label, with the labels none has (Label the first, Labels all).
func (e *Engine) labelWaiting(r *checkpoint.Run) *client.Waiting {
	if r.Status != checkpoint.StatusPending || r.Owner != "" {
		return nil
	}
	need := leader.RunLabels(e.specs, r)
	if len(need) == 0 {
		return nil
	}
	missing := e.labels.unplaced(need)
	if len(missing) == 0 {
		return nil
	}
	return &client.Waiting{Kind: client.WaitLabel, Label: missing[0], Labels: slices.Clone(missing), Since: ts(r.UpdatedAt)}
}

// showLabelWaits marks the runs among runs that wait for a label as waiting.
func (e *Engine) showLabelWaits(out []client.Run, runs []checkpoint.Run) {
	for i := range runs {
		if out[i].Waiting != nil {
			continue
		}
		if w := e.labelWaiting(&runs[i]); w != nil {
			out[i].Status, out[i].Waiting = string(checkpoint.StatusWaiting), w
		}
	}
}

// waitingForLabel counts the queued runs that wait for a label, by the first label no
// live node has, reading at most MaxParkedCounted queued runs (Metrics).
func (e *Engine) waitingForLabel() map[string]int {
	out := map[string]int{}
	read := 0
	_ = e.store.EachQueued(func(r *checkpoint.Run) checkpoint.QueueVerdict {
		if read++; read > MaxParkedCounted {
			return checkpoint.QueueStop
		}
		if w := e.labelWaiting(r); w != nil {
			out[w.Label]++
		}
		return checkpoint.QueueNext
	})
	return out
}
