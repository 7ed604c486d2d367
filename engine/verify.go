package engine

import (
	"fmt"
	"strings"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
)

// VerifyRun re-checks a run's invariants from the state alone (flowctl run verify, the
// zombie drill): epochs only grow; every accepted commit carried the run's epoch of that
// moment; no (step, item) has two accepted commits; every fenced commit carried an epoch
// no newer than the current one. It reads v only, so a test can hand it a state written
// with the rules' guards off (internal/app/apiserver/apitest) and see each violation.
func VerifyRun(v *checkpoint.RunView) client.Verification {
	res := client.Verification{ID: v.Run.ID, Checked: []string{
		"epochs only grow",
		"every accepted commit carried the run's epoch of that moment",
		"one accepted commit per step and item",
		"fenced commits carried an epoch no newer than the one then current",
	}, Violations: []string{}}
	bad := func(format string, args ...any) {
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
	}
	var prev int64
	for _, e := range v.Run.Epochs {
		if e.Epoch <= prev {
			bad("epoch %d follows epoch %d", e.Epoch, prev)
		}
		prev = e.Epoch
	}
	var current int64
	accepted := map[string]uint64{}
	for _, ev := range v.Events {
		if ev.Outcome != "accepted" {
			continue
		}
		switch ev.Kind {
		case checkpoint.KindAssign:
			current = int64(ev.Seq) // an accepted assign's epoch is its sequence
		case checkpoint.KindRetry:
			// A retry from a step resets it and its dependents: their next commits are
			// the first of a new epoch (the earlier ones stay in the history).
			for key := range accepted {
				for _, st := range ev.Steps {
					if strings.HasPrefix(key, st+"/") {
						delete(accepted, key)
					}
				}
			}
		case checkpoint.KindCommit:
			if ev.Epoch != current {
				bad("commit of %s item %d at sequence %d carried epoch %d while the run's epoch was %d", ev.Step, ev.Item, ev.Seq, ev.Epoch, current)
			}
			key := fmt.Sprintf("%s/%d", ev.Step, ev.Item)
			if first, ok := accepted[key]; ok {
				bad("step %s item %d has two accepted commits (sequences %d and %d)", ev.Step, ev.Item, first, ev.Seq)
			} else {
				accepted[key] = ev.Seq
			}
		}
	}
	for _, f := range v.Fenced {
		if f.Epoch > f.CurrentEpoch {
			bad("fenced commit of %s at sequence %d carried epoch %d, newer than the current %d", f.Step, f.Seq, f.Epoch, f.CurrentEpoch)
		}
	}
	res.OK = len(res.Violations) == 0
	return res
}
