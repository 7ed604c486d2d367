package leader

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/internal/testkit/failtb"
)

// priorityProperty is the starvation bound of the leader's order, over a real store
// and PlanAssign: runs of random priorities are submitted at random moments (with the
// leader taking some of them between submits, as its passes do), and at a random
// moment the leader plans with room for all. Then, with P the highest priority queued,
// every queued run x is planned before every run submitted more than (P - x's
// priority) x aging after it: however many runs of higher priority keep coming, a
// waiting run is passed only by those that came within a bounded time after it. And
// the plan is in order of effective priority (checkpoint.Effective), then of
// submission.
//
// orderAging is the leader's aging (PlanOptions.Aging), bound the aging of the bound:
// the same but in the control, whose leader orders by priority alone.
func priorityProperty(orderAging, aging time.Duration) func(*rapid.T) {
	return func(t *rapid.T) {
		s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sp := specs.New(s)
		now := t0
		apply := func(es ...checkpoint.Entry) {
			for i := range es {
				es[i].At = now
			}
			msg, err := checkpoint.EncodeMessageIn(checkpoint.NewestLogFormat, "model", es...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Apply(s.Applied()+1, msg); err != nil {
				t.Fatal(err)
			}
		}
		n := rapid.IntRange(2, 40).Draw(t, "runs")
		for i := range n {
			now = now.Add(time.Duration(rapid.IntRange(0, 120).Draw(t, "gap s")) * time.Second)
			p := rapid.IntRange(-5, 5).Draw(t, "priority")
			apply(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: fmt.Sprintf("r%02d", i),
				Submit: &checkpoint.Submit{Workflow: "w", Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: 3,
					Steps: []checkpoint.StepSpec{{Name: "a"}}, Priority: p}})
			if rapid.IntRange(0, 3).Draw(t, "a pass") == 0 { // the leader takes one, as a pass with room for one would
				plan, err := PlanAssign(s, sp, 1, PlanOptions{Now: now, Aging: orderAging})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range plan {
					apply(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: r.ID, Epoch: r.Epoch, Term: 1, Owner: "leader"})
				}
			}
		}
		now = now.Add(time.Duration(rapid.IntRange(0, 600).Draw(t, "then s")) * time.Second)
		plan, err := PlanAssign(s, sp, 1000, PlanOptions{Now: now, Aging: orderAging})
		if err != nil {
			t.Fatal(err)
		}
		high := checkpoint.MinPriority
		for _, r := range plan {
			high = max(high, r.Priority)
		}
		for i, x := range plan {
			for _, y := range plan[:i] {
				if y.CreatedAt.Sub(x.CreatedAt) > time.Duration(high-x.Priority)*aging {
					t.Fatalf("%s (priority %d, created %s) waits behind %s (priority %d, created %s later), beyond the bound %s",
						x.ID, x.Priority, x.CreatedAt.Sub(t0), y.ID, y.Priority, y.CreatedAt.Sub(x.CreatedAt), time.Duration(high-x.Priority)*aging)
				}
				ex, ey := checkpoint.Effective(x.Priority, x.CreatedAt, now, orderAging), checkpoint.Effective(y.Priority, y.CreatedAt, now, orderAging)
				if ey < ex || ey == ex && y.CreatedSeq > x.CreatedSeq {
					t.Fatalf("%s (effective %d) planned before %s (effective %d)", y.ID, ey, x.ID, ex)
				}
			}
		}
	}
}

// The leader's starvation bound holds with an aging of a minute (and of a second).
func TestPriorityStarvationBound(t *testing.T) {
	for _, aging := range []time.Duration{time.Second, time.Minute} {
		t.Run(aging.String(), func(t *testing.T) { rapid.Check(t, priorityProperty(aging, aging)) })
	}
}

// The control: without aging (priorities alone), a run of low priority waits behind
// runs of higher priority submitted any time after it: the property finds one.
func TestPriorityStarvationBoundControlNoAging(t *testing.T) {
	setRapidFlag(t, "rapid.checks", "2000")
	setRapidFlag(t, "rapid.shrinktime", "2s")
	setRapidFlag(t, "rapid.nofailfile", "true")
	rec := failtb.New(t)
	rapid.Check(rec, priorityProperty(0, time.Minute))
	if !rec.Failed() {
		t.Fatal("without aging, no run of low priority was overtaken beyond the bound: the property cannot fail")
	}
	t.Logf("found: %s", strings.Join(rec.Msgs, "\n"))
}
