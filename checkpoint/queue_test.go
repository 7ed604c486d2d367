package checkpoint

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
)

// The admission view the applier keeps (queue.go) always equals what a scan of every
// run finds: the runs needing an assign in submission order, and the counts of runs
// assigned-and-waiting and running (the runs in order of priority, then of submission:
// EachQueued, without aging); after each message of a random log and after the
// store is reopened (it is rebuilt at open).
func TestQueueMatchesAScan(t *testing.T) {
	dir := t.TempDir()
	iteration := 0
	rapid.Check(t, func(t *rapid.T) {
		iteration++
		msgs := checkpointtest.RandomLog(rapid.Uint64().Draw(t, "seed"), rapid.IntRange(1, 80).Draw(t, "messages"))
		path := filepath.Join(dir, fmt.Sprint(iteration))
		s, err := OpenStore(path, StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range msgs {
			if _, err := s.Apply(uint64(i+1), m); err != nil {
				t.Fatal(err)
			}
			checkQueue(t, s, i+1)
		}
		s.Close()
		if s, err = OpenStore(path, StoreOptions{}); err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkQueue(t, s, -1)
	})
}

func checkQueue(t *rapid.T, s *Store, seq int) {
	var want []*Run
	wantAssigned, wantRunning := 0, 0
	for _, st := range []RunStatus{StatusPending, StatusRunning} {
		if err := s.EachRun(ListOptions{Status: st}, func(r *Run) bool {
			switch {
			case r.NeedsAssign():
				want = append(want, r)
			case r.Status == StatusPending:
				wantAssigned++
			default:
				wantRunning++
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	slices.SortFunc(want, func(a, b *Run) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), cmp.Compare(a.CreatedSeq, b.CreatedSeq), cmp.Compare(a.ID, b.ID))
	})
	var wantIDs, got []string
	for _, r := range want {
		wantIDs = append(wantIDs, r.ID)
	}
	if err := s.EachQueued(func(r *Run) QueueVerdict { got = append(got, r.ID); return QueueNext }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, wantIDs) {
		t.Fatalf("after message %d (-1: reopened) the queued runs are %v, a scan finds %v", seq, got, wantIDs)
	}
	if n := s.QueuedRuns(); n != len(wantIDs) {
		t.Fatalf("after message %d: QueuedRuns %d, a scan finds %d", seq, n, len(wantIDs))
	}
	if a, r := s.Held(); a != wantAssigned || r != wantRunning {
		t.Fatalf("after message %d: Held %d assigned, %d running; a scan finds %d, %d", seq, a, r, wantAssigned, wantRunning)
	}
}

// The queue keeps submission order through hand-backs (a run goes back to its place),
// stale entries and compaction, and EachQueued stops when asked.
func TestQueueOrderAndCompaction(t *testing.T) {
	var rq runQueue
	rq.init()
	pending := func(id string, seq uint64) *Run { return &Run{ID: id, Status: StatusPending, CreatedSeq: seq} }
	for i := 1; i <= 5000; i++ {
		rq.note(pending(fmt.Sprintf("r%05d", i), uint64(i)))
	}
	// Assign the first 3000 in order: the head drops them, compaction keeps the rest.
	for i := 1; i <= 3000; i++ {
		r := pending(fmt.Sprintf("r%05d", i), uint64(i))
		r.Epoch = int64(10000 + i)
		rq.note(r)
	}
	// One of them is handed back: it goes back ahead of the others.
	back := pending("r00007", 7)
	back.Epoch, back.HandedBack = 10007, true
	rq.note(back)
	ids := lineIDs(&rq, "", 3)
	if want := []string{"r00007", "r03001", "r03002"}; !slices.Equal(ids, want) {
		t.Fatalf("head %v, want %v", ids, want)
	}
	if n := len(rq.lines[lineKey{}].order); n > 2002+1024 {
		t.Fatalf("the line holds %d entries for 2001 queued runs: stale entries were not dropped", n)
	}
	if rq.assigned != 2999 {
		t.Fatalf("assigned %d, want 2999", rq.assigned)
	}
	if all := lineIDs(&rq, "", 5000); len(all) != 2001 || !slices.IsSortedFunc(all[1:], cmp.Compare[string]) {
		t.Fatalf("walked %d runs (want 2001) or out of order", len(all))
	}
	// Once every run is assigned, the line is forgotten.
	for i := 1; i <= 5000; i++ {
		r := pending(fmt.Sprintf("r%05d", i), uint64(i))
		r.Epoch = int64(20000 + i)
		rq.note(r)
	}
	if len(rq.lines) != 0 || len(rq.seq) != 0 {
		t.Fatalf("%d lines, %d queued runs left after every run was assigned", len(rq.lines), len(rq.seq))
	}
}

// lineIDs walks up to n queued runs of workflow's line.
func lineIDs(rq *runQueue, workflow string, n int) []string {
	var ids []string
	var after *queued
	for len(ids) < n {
		e, ok := rq.next(lineKey{workflow: workflow}, after)
		if !ok {
			break
		}
		ids = append(ids, e.id)
		after = &e
	}
	return ids
}

// EachQueuedAt merges the lines (a workflow's runs of one priority) by effective
// priority, then oldest first, and a workflow skipped (its concurrency limit reached)
// costs one read per line: after a random log over three workflows (with runs of
// several priorities), with a random number of runs taken per workflow before it is
// skipped, a random point to stop and a random moment and aging, the runs EachQueuedAt
// reads are exactly those a scan in order of effective priority and submission says the
// scheduler must look at, and no more.
func TestEachQueuedSkipsAWorkflowInOneRead(t *testing.T) {
	dir := t.TempDir()
	iteration := 0
	rapid.Check(t, func(t *rapid.T) {
		iteration++
		msgs := checkpointtest.RandomLog(rapid.Uint64().Draw(t, "seed"), rapid.IntRange(1, 80).Draw(t, "messages"))
		s, err := OpenStore(filepath.Join(dir, fmt.Sprint(iteration)), StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for i, m := range msgs {
			if _, err := s.Apply(uint64(i+1), m); err != nil {
				t.Fatal(err)
			}
		}
		limit := map[string]int{}
		for _, wf := range []string{"wf0", "wf1", "wf2"} {
			limit[wf] = rapid.IntRange(0, 6).Draw(t, "limit "+wf)
		}
		stopAfter := rapid.IntRange(1, 40).Draw(t, "stop after")
		// The walk's moment and aging: runs are created a millisecond per message apart
		// (RandomLog), so an aging of a few milliseconds lifts old runs of low priority
		// above newer ones of higher priority.
		now := checkpointtest.Epoch.Add(time.Duration(rapid.IntRange(0, 200).Draw(t, "now ms")) * time.Millisecond)
		aging := []time.Duration{0, time.Millisecond, 5 * time.Millisecond, time.Hour}[rapid.IntRange(0, 3).Draw(t, "aging")]

		// The model: every queued run in submission order.
		var queued []*Run
		if err := s.EachRun(ListOptions{Status: StatusPending}, func(r *Run) bool {
			if r.NeedsAssign() {
				queued = append(queued, r)
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(queued, func(a, b *Run) int {
			return cmp.Or(cmp.Compare(Effective(b.Priority, b.CreatedAt, now, aging), Effective(a.Priority, a.CreatedAt, now, aging)),
				cmp.Compare(a.CreatedSeq, b.CreatedSeq), cmp.Compare(a.ID, b.ID))
		})
		var want []string
		taken, skipped, total := map[string]int{}, map[string]bool{}, 0
		for _, r := range queued {
			if skipped[r.Workflow] || total == stopAfter {
				continue
			}
			want = append(want, r.ID)
			if taken[r.Workflow] >= limit[r.Workflow] {
				skipped[r.Workflow] = true
				continue
			}
			taken[r.Workflow]++
			total++
		}

		var got []string
		taken, total = map[string]int{}, 0
		if err := s.EachQueuedAt(now, aging, func(r *Run) QueueVerdict {
			got = append(got, r.ID)
			if taken[r.Workflow] >= limit[r.Workflow] {
				return QueueSkipWorkflow
			}
			taken[r.Workflow]++
			if total++; total == stopAfter {
				return QueueStop
			}
			return QueueNext
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limits %v, stop after %d, now %s, aging %s: EachQueuedAt read %v, want %v", limit, stopAfter, now, aging, got, want)
		}
	})
}
