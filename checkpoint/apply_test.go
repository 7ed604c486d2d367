package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// a run with two steps, assigned and claimed by owner a.
func claimedRun(t *testing.T, s *Store) int64 {
	t.Helper()
	mustApply(t, s, submitEntry("r1", StepSpec{Name: "one"}, StepSpec{Name: "each", Foreach: true}))
	epoch := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Term: 1, At: t0}))
	mustApply(t, s, Entry{Kind: KindClaim, Run: "r1", Epoch: epoch, Owner: "a", At: t0})
	return epoch
}

func TestAssignEpochIsTheEntrySequence(t *testing.T) {
	s := memStore(t, nil)
	epoch := claimedRun(t, s)
	r, err := s.Run("r1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Epoch != epoch || r.Epoch != 2 || r.Status != StatusRunning || r.Owner != "a" {
		t.Fatalf("run = epoch %d status %s owner %q; want epoch 2 (the assign's sequence), running, owner a", r.Epoch, r.Status, r.Owner)
	}
	if len(r.Epochs) != 1 || r.Epochs[0].Reason != ReasonAssigned || r.Epochs[0].Owner != "a" || r.EpochChanges != 0 {
		t.Fatalf("epoch history %+v changes %d; want one 'assigned' epoch owned by a, 0 changes", r.Epochs, r.EpochChanges)
	}
}

// An assign naming a worker (the leader's own) is a claim by it in the same entry: no
// other worker can claim that epoch, the worker's commits are accepted, and losing it
// counts like losing any claimed epoch.
func TestAssignToWorkerClaimsAtOnce(t *testing.T) {
	s := memStore(t, nil)
	mustApply(t, s, submitEntry("r1", StepSpec{Name: "one"}))
	epoch := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Term: 1, Worker: "a", At: t0}))
	r, _ := s.Run("r1")
	if r.Status != StatusRunning || r.Owner != "a" || r.Epoch != epoch || r.Epochs[0].Owner != "a" || r.EpochChanges != 0 {
		t.Fatalf("run after an assign to a: %s owner %q epoch %d/%d epochs %+v changes %d; want running, owned by a, not counted",
			r.Status, r.Owner, r.Epoch, epoch, r.Epochs, r.EpochChanges)
	}
	if _, err := applyOne(t, s, Entry{Kind: KindClaim, Run: "r1", Epoch: epoch, Owner: "b", At: t0}); !errors.Is(err, ErrFenced) {
		t.Fatalf("b claimed an epoch assigned to a: %v, want ErrFenced", err)
	}
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: epoch, Owner: "a", At: t0})
	// Lost after its claim: the next epoch counts.
	next := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: epoch, Term: 1, Reason: ReasonLeaseExpired, At: t0}))
	r, _ = s.Run("r1")
	if r.Epoch != next || r.EpochChanges != 1 || r.Status != StatusPending {
		t.Fatalf("after losing a: epoch %d changes %d status %s; want %d, 1, pending", r.Epoch, r.EpochChanges, r.Status, next)
	}
}

func TestStaleCommitIsFencedAndRecorded(t *testing.T) {
	s := memStore(t, nil)
	old := claimedRun(t, s)
	mustApply(t, s, Entry{Kind: KindStart, Run: "r1", Step: "one", Item: ItemWhole, Epoch: old, Owner: "a", At: t0})
	// a is paused; its lease lapses; the leader reclaims and b claims.
	cur := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: old, Term: 1, Reason: ReasonLeaseExpired, At: t0}))
	steps, _ := s.Steps("r1")
	if steps[0].Status != StepPending {
		t.Fatalf("after reclaim, step one is %s; want pending (nothing left running without an owner)", steps[0].Status)
	}
	mustApply(t, s, Entry{Kind: KindClaim, Run: "r1", Epoch: cur, Owner: "b", At: t0})
	// a wakes and commits with its old epoch.
	seq, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: old, Owner: "a", Output: json.RawMessage(`{"x":1}`), At: t0})
	var fe *FencedError
	if !errors.Is(err, ErrFenced) || !errors.As(err, &fe) {
		t.Fatalf("zombie commit: err = %v, want ErrFenced", err)
	}
	if fe.Epoch != old || fe.CurrentEpoch != cur || fe.Reason != "stale-epoch" || fe.Seq != seq {
		t.Fatalf("fenced error = %+v; want epoch %d current %d stale-epoch seq %d", fe, old, cur, seq)
	}
	v, err := s.View("r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Fenced) != 1 || v.Fenced[0].Owner != "a" || v.Fenced[0].Epoch != old || v.Fenced[0].CurrentEpoch != cur || v.Fenced[0].Step != "one" {
		t.Fatalf("fenced records = %+v; want a's commit with both epochs", v.Fenced)
	}
	if v.Steps[0].Status != StepPending || v.Steps[0].Output != nil {
		t.Fatalf("step one = %+v; the fenced commit must change nothing", v.Steps[0].Step)
	}
	if v.Run.EpochChanges != 1 || v.Run.Epochs[1].Reason != ReasonLeaseExpired || v.Run.Epochs[1].Owner != "b" {
		t.Fatalf("run epochs %+v changes %d; want a lease-expired epoch owned by b, 1 change", v.Run.Epochs, v.Run.EpochChanges)
	}
	// b's commit is accepted; a second commit of the same step is fenced even at the current epoch.
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: cur, Owner: "b", Output: json.RawMessage(`{"x":2}`), At: t0})
	if _, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: cur, Owner: "b", At: t0}); !errors.Is(err, ErrFenced) {
		t.Fatalf("second commit of a checkpointed step: err = %v, want ErrFenced", err)
	}
	// and a start of a checkpointed step is refused: a resumed run never re-runs it.
	if _, err := applyOne(t, s, Entry{Kind: KindStart, Run: "r1", Step: "one", Item: ItemWhole, Epoch: cur, Owner: "b", At: t0}); !errors.Is(err, ErrFenced) {
		t.Fatalf("start of a checkpointed step: err = %v, want ErrFenced", err)
	}
}

func TestForeachItemsCheckpointSeparately(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	mustApply(t, s, Entry{Kind: KindStart, Run: "r1", Step: "each", Item: ItemWhole, Items: 3, Epoch: e, Owner: "a", At: t0})
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: 0, Epoch: e, Owner: "a", Output: json.RawMessage(`1`), At: t0})
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: 2, Epoch: e, Owner: "a", Output: json.RawMessage(`3`), At: t0})
	if _, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: 2, Epoch: e, Owner: "a", At: t0}); !errors.Is(err, ErrFenced) {
		t.Fatalf("second commit of item 2: %v, want ErrFenced", err)
	}
	if _, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: 3, Epoch: e, Owner: "a", At: t0}); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("item 3 of 3: %v, want ErrInvalidEntry", err)
	}
	if _, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: 0, Epoch: e, Owner: "a", At: t0}); !errors.Is(err, ErrInvalidEntry) {
		t.Fatalf("item of a step without foreach: %v, want ErrInvalidEntry", err)
	}
	items, err := s.Items("r1", "each")
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || items[0].Index != 0 || items[1].Index != 2 {
		t.Fatalf("items = %+v; want items 0 and 2", items)
	}
	steps, _ := s.Steps("r1")
	if steps[1].Items != 3 || steps[1].ItemsDone != 2 || steps[1].Status != StepRunning {
		t.Fatalf("foreach step = %+v; want 2 of 3 done, running", steps[1])
	}
}

func TestMaxEpochsDeadLettersInsteadOfChanging(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s) // max_epochs 3
	for i := 0; i < 3; i++ {
		e = int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Reason: ReasonLeaseExpired, At: t0}))
		mustApply(t, s, Entry{Kind: KindClaim, Run: "r1", Epoch: e, Owner: "w", At: t0})
	}
	_, err := applyOne(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Reason: ReasonLeaseExpired, At: t0})
	if !errors.Is(err, ErrDeadLettered) {
		t.Fatalf("4th counted change: %v, want ErrDeadLettered", err)
	}
	r, _ := s.Run("r1")
	if r.Status != StatusDeadLettered || r.Epoch != e || r.EpochChanges != 3 || r.Owner != "" || !strings.Contains(r.DeadLetter, "max_epochs 3") {
		t.Fatalf("run = %s epoch %d changes %d owner %q reason %q; want dead_lettered at epoch %d with 3 changes", r.Status, r.Epoch, r.EpochChanges, r.Owner, r.DeadLetter, e)
	}
	dl, _, _ := s.ListRuns(ListOptions{Status: StatusDeadLettered})
	if len(dl) != 1 {
		t.Fatalf("dead-lettered list = %d runs, want 1", len(dl))
	}
	if _, err := applyOne(t, s, Entry{Kind: KindPurge, Run: "r1", At: t0}); err != nil {
		t.Fatalf("purge: %v", err)
	}
	if r, _ := s.Run("r1"); r.Status != StatusCancelled || !strings.Contains(r.Error, "purged") {
		t.Fatalf("after purge: %s %q", r.Status, r.Error)
	}
	if _, err := applyOne(t, s, Entry{Kind: KindPurge, Run: "r1", At: t0}); !errors.Is(err, ErrConflict) {
		t.Fatalf("purge of a run not in the DLQ: %v", err)
	}
	// An operator's retry resets the count and gives a new, uncounted epoch.
	mustApply(t, s, Entry{Kind: KindRetry, Run: "r1", At: t0})
	e2 := int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, At: t0}))
	r, _ = s.Run("r1")
	if r.Status != StatusPending || r.Epoch != e2 || r.EpochChanges != 0 || r.Epochs[len(r.Epochs)-1].Reason != ReasonRetried {
		t.Fatalf("after retry: %s epoch %d changes %d epochs %+v", r.Status, r.Epoch, r.EpochChanges, r.Epochs)
	}
}

func TestHandBackAndNeverClaimedDoNotCount(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	mustApply(t, s, Entry{Kind: KindRequeue, Run: "r1", Epoch: e, Owner: "a", At: t0})
	e = int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Reason: ReasonLeaseExpired, At: t0}))
	// assigned but the task was lost: reassign
	e = int64(mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Reason: ReasonReconciled, At: t0}))
	r, _ := s.Run("r1")
	reasons := []string{}
	for _, ep := range r.Epochs {
		reasons = append(reasons, ep.Reason)
	}
	if r.EpochChanges != 0 || strings.Join(reasons, ",") != "assigned,released,reconciled" || r.Epoch != e {
		t.Fatalf("changes %d reasons %v; want 0 changes and assigned,released,reconciled", r.EpochChanges, reasons)
	}
}

func TestStaleTermRejected(t *testing.T) {
	s := memStore(t, nil)
	mustApply(t, s, submitEntry("r1", StepSpec{Name: "one"}))
	mustApply(t, s, submitEntry("r2", StepSpec{Name: "one"}))
	mustApply(t, s, Entry{Kind: KindAssign, Run: "r1", Term: 7, At: t0})
	seq, err := applyOne(t, s, Entry{Kind: KindAssign, Run: "r2", Term: 5, At: t0})
	var st *StaleTermError
	if !errors.Is(err, ErrStaleTerm) || !errors.As(err, &st) || st.Term != 5 || st.HighestTerm != 7 || st.Seq != seq {
		t.Fatalf("old leader's assign: %v, want a StaleTermError 5 < 7", err)
	}
	if r, _ := s.Run("r2"); r.Epoch != 0 {
		t.Fatalf("rejected assign changed r2's epoch to %d", r.Epoch)
	}
	recs, _ := s.StaleTerms()
	if len(recs) != 1 || recs[0].Run != "r2" || s.HighestTerm() != 7 {
		t.Fatalf("stale-term records %+v highest %d", recs, s.HighestTerm())
	}
}

func TestCronTickOnce(t *testing.T) {
	s := memStore(t, nil)
	tick := func(outcome string) Entry {
		e := Entry{Kind: KindCronTick, Term: 1, At: t0, Tick: &CronTick{Workflow: "wf", At: t0, Outcome: outcome}}
		if outcome == TickFired {
			e.Run, e.Tick.RunID = "wf-20261129T020000Z", "wf-20261129T020000Z"
			e.Submit = &Submit{Workflow: "wf", Trigger: TriggerCron, ScheduledAt: t0, Steps: []StepSpec{{Name: "one"}}}
		}
		return e
	}
	mustApply(t, s, tick(TickFired))
	if _, err := applyOne(t, s, tick(TickFired)); !errors.Is(err, ErrTickExists) {
		t.Fatalf("second fire of one tick: %v, want ErrTickExists", err)
	}
	runs, _, _ := s.ListRuns(ListOptions{Workflow: "wf"})
	ticks, _ := s.Ticks("wf")
	if len(runs) != 1 || len(ticks) != 1 || !runs[0].ScheduledAt.Equal(t0) || runs[0].Trigger != TriggerCron {
		t.Fatalf("runs %d ticks %d; want one of each", len(runs), len(ticks))
	}
}

func TestCompleteNeedsEveryStep(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	if _, err := applyOne(t, s, Entry{Kind: KindComplete, Run: "r1", Epoch: e, Owner: "a", Status: StatusSucceeded, At: t0}); !errors.Is(err, ErrConflict) {
		t.Fatalf("succeed with pending steps: %v, want ErrConflict", err)
	}
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: e, Owner: "a", At: t0})
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: ItemWhole, Epoch: e, Owner: "a", Skipped: true, At: t0})
	mustApply(t, s, Entry{Kind: KindComplete, Run: "r1", Epoch: e, Owner: "a", Status: StatusSucceeded, At: t0})
	if _, err := applyOne(t, s, Entry{Kind: KindCancel, Run: "r1", At: t0}); !errors.Is(err, ErrConflict) {
		t.Fatalf("cancel a finished run: %v, want ErrConflict", err)
	}
	ok, _, _ := s.ListRuns(ListOptions{Workflow: "wf", Status: StatusSucceeded})
	running, _, _ := s.ListRuns(ListOptions{Status: StatusRunning})
	if len(ok) != 1 || len(running) != 0 {
		t.Fatalf("status index: %d succeeded, %d running; want 1 and 0", len(ok), len(running))
	}
}

func TestListRunsPages(t *testing.T) {
	s := memStore(t, nil)
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5"} {
		mustApply(t, s, submitEntry(id, StepSpec{Name: "one"}))
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		runs, next, err := s.ListRuns(ListOptions{Status: StatusPending, After: after, Limit: 2})
		if err != nil || pages > 5 {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, r := range runs {
			got = append(got, r.ID)
		}
		if next == "" {
			break
		}
		after = next
	}
	if strings.Join(got, ",") != "a1,a2,a3,a4,a5" {
		t.Fatalf("paged runs = %v", got)
	}
	if _, _, err := s.ListRuns(ListOptions{Status: "runing"}); !errors.Is(err, ErrInvalidEntry) || !strings.Contains(err.Error(), "use pending") {
		t.Fatalf("bad status filter: %v", err)
	}
}

// Bad input: a message that cannot be decoded is recorded as rejected at its sequence
// and changes no run: applying goes on past it. A message of a newer format version
// stops the applier (an error that says to upgrade) and changes nothing at all.
func TestUndecodableMessagesAreRejected(t *testing.T) {
	s := memStore(t, nil)
	claimedRun(t, s)
	var before bytes.Buffer
	if err := s.Dump(&before); err != nil {
		t.Fatal(err)
	}
	good := msg(t, Entry{Kind: KindCancel, Run: "r1", At: t0})
	future := bytes.Replace(good, []byte(`"v":1`), fmt.Appendf(nil, `"v":%d`, Revision+1), 1)
	if _, err := s.Apply(s.Applied()+1, future); !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), "upgrade flowd") {
		t.Fatalf("a newer format: %v; want ErrNewerFormat saying to upgrade", err)
	}
	var same bytes.Buffer
	if err := s.Dump(&same); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before.Bytes(), same.Bytes()) {
		t.Fatal("a message of a newer format changed the state")
	}
	cases := []struct {
		name, detail string
		data         []byte
	}{
		{"truncated", "decode", good[:len(good)/2]},
		{"empty", "decode", []byte{}},
		{"not json", "decode", []byte("\x00\x01garbage")},
		{"unknown kind", `unknown kind "teleport"`, bytes.Replace(good, []byte(`"cancel"`), []byte(`"teleport"`), 1)},
		{"unknown field", "unknown field", bytes.Replace(good, []byte(`"run":`), []byte(`"zzz":1,"run":`), 1)},
		{"no entries", "no entries", []byte(`{"v":1,"entries":[]}`)},
		{"trailing", "trailing data", append(append([]byte(nil), good...), []byte(`{}`)...)},
		{"older version", "revision 0", bytes.Replace(good, []byte(`"v":1`), []byte(`"v":0`), 1)},
	}
	first := s.Applied() + 1
	for i, c := range cases {
		seq := first + uint64(i)
		verdicts, err := s.Apply(seq, c.data)
		if err != nil || verdicts == nil || len(verdicts) != 0 || s.Applied() != seq {
			t.Fatalf("%s: %v %v (applied %d); want it rejected at %d with no verdicts", c.name, verdicts, err, s.Applied(), seq)
		}
	}
	rejected, err := s.RejectedMessages()
	if err != nil || len(rejected) != len(cases) {
		t.Fatalf("rejections recorded: %v %v", rejected, err)
	}
	for i, c := range cases {
		if rejected[i].Seq != first+uint64(i) || !strings.Contains(rejected[i].Detail, c.detail) {
			t.Errorf("%s: recorded %+v; want sequence %d, detail with %q", c.name, rejected[i], first+uint64(i), c.detail)
		}
	}
	if got := s.Counters().LogRejected.Load(); got != int64(len(cases)) {
		t.Errorf("LogRejected = %d, want %d", got, len(cases))
	}
	// No run changed, and the next good message applies.
	if r, _ := s.Run("r1"); r.Status != StatusRunning {
		t.Fatalf("r1 is %s after the rejected messages", r.Status)
	}
	if _, err := applyOne(t, s, Entry{Kind: KindCancel, Run: "r1", At: t0}); err != nil {
		t.Fatalf("the next good message: %v", err)
	}
}

// The control of TestUndecodableMessagesAreRejected: with Hooks.StopOnUndecodable (the
// rejection off), each of the same messages stops the applier (an error, the applied
// sequence unmoved, nothing recorded): one garbage message would stop every node at the
// same sequence, for good (logstream TestGarbageInTheLogIsRejected shows the node stop).
func TestUndecodableMessagesStopTheApplierWithoutTheRejection(t *testing.T) {
	good := msg(t, Entry{Kind: KindCancel, Run: "r1", At: t0})
	for _, data := range [][]byte{good[:len(good)/2], []byte("\x00\x01garbage"), bytes.Replace(good, []byte(`"cancel"`), []byte(`"teleport"`), 1)} {
		s := memStore(t, &testhooks.Hooks{StopOnUndecodable: true})
		claimedRun(t, s)
		at := s.Applied() + 1
		verdicts, err := s.Apply(at, data)
		var corrupt *CorruptError
		if err == nil || !errors.As(err, &corrupt) || verdicts != nil {
			t.Fatalf("control: %q gave %v %v; want the applier stopped by a CorruptError: the control shows nothing", data, verdicts, err)
		}
		rejected, rerr := s.RejectedMessages()
		if s.Applied() != at-1 || rerr != nil || len(rejected) != 0 {
			t.Fatalf("control: applied %d, rejections %v %v; want %d and none recorded", s.Applied(), rejected, rerr, at-1)
		}
		if r, _ := s.Run("r1"); r.Status != StatusRunning {
			t.Fatalf("control: r1 is %s", r.Status)
		}
	}
}

// A failure of this node's storage during apply stops the applier with ErrStorage and
// commits nothing: a verdict made on a failed read would differ from other nodes'.
// (Here the state holds an undecodable run record, as a corrupt disk would leave it.)
func TestStorageErrorStopsTheApplier(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	if err := s.db.Set(keyRun("r1"), []byte("{not json"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	s.dropCache()
	applied := s.Applied()
	_, err := s.Apply(applied+1, msg(t, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: e, Owner: "a", Output: json.RawMessage(`{}`), At: t0}))
	if !errors.Is(err, ErrStorage) {
		t.Fatalf("apply over a corrupt run record: %v; want ErrStorage", err)
	}
	if s.Applied() != applied {
		t.Fatalf("applied moved to %d past a failed apply", s.Applied())
	}
}

// Entries that decode but are invalid are rejected one by one, changing nothing else.
func TestInvalidEntriesRejected(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	bad := []Entry{
		{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: e, At: t0},                    // no owner
		{Kind: KindCommit, Run: "r1", Step: "One!", Item: ItemWhole, Epoch: e, Owner: "a", At: t0},       // bad step name
		{Kind: KindCommit, Run: "r1", Step: "nope", Item: ItemWhole, Epoch: e, Owner: "a", At: t0},       // unknown step
		{Kind: KindCommit, Run: "r1", Step: "one", Item: -2, Epoch: e, Owner: "a", At: t0},               // bad item
		{Kind: KindAssign, Run: "r1", Epoch: e, At: t0},                                                  // no term
		{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Reason: "whim", At: t0},                         // bad reason
		{Kind: KindAssign, Run: "r1", Epoch: e, Term: 1, Worker: "w/1", At: t0},                          // bad worker
		{Kind: KindClaim, Run: "r1", Epoch: e, Owner: "a", Worker: "a", At: t0},                          // worker off an assign
		{Kind: KindComplete, Run: "r1", Epoch: e, Owner: "a", Status: "meh", At: t0},                     // bad status
		{Kind: KindClaim, Run: "bad/id", Epoch: e, Owner: "a", At: t0},                                   // bad run ID
		{Kind: KindSubmit, Run: "r9", At: t0},                                                            // no submit
		{Kind: KindCronTick, Term: 1, At: t0, Tick: &CronTick{Workflow: "wf", At: t0, Outcome: "fired"}}, // fired without run
	}
	for i, b := range bad {
		if _, err := applyOne(t, s, b); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("bad entry %d (%s): err = %v, want ErrInvalidEntry", i, b.Kind, err)
		}
	}
	// An output that is not JSON, as only a foreign writer could publish it.
	raw := []byte(fmt.Sprintf(`{"v":1,"entries":[{"k":"commit","run":"r1","epoch":%d,"owner":"a","step":"one","item":-1,"output":{,"at":"2026-11-29T02:00:00Z"}]}`, e))
	if verdicts, err := s.Apply(s.Applied()+1, raw); err != nil || len(verdicts) != 0 {
		t.Errorf("output that is not JSON: %v %v, want the message rejected", verdicts, err)
	}
	v, _ := s.View("r1")
	if v.Steps[0].Status != StepPending || v.Run.Status != StatusRunning || v.Run.Epoch != e || len(v.Fenced) != 0 {
		t.Fatalf("invalid entries changed the run: %+v", v.Run)
	}
	if _, err := s.Run("r9"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("r9 exists after an invalid submit: %v", err)
	}
}

func TestTwoAssignsOfOneRunInOneMessage(t *testing.T) {
	s := memStore(t, nil)
	mustApply(t, s, submitEntry("r1", StepSpec{Name: "one"}))
	a := Entry{Kind: KindAssign, Run: "r1", Term: 1, At: t0}
	res, err := s.Apply(s.Applied()+1, msg(t, a, a))
	if err != nil {
		t.Fatal(err)
	}
	if res[0] != nil || !errors.Is(res[1], ErrConflict) {
		t.Fatalf("results %v; want the second assign of the message rejected", res)
	}
}

func TestWorkflowVersions(t *testing.T) {
	s := memStore(t, nil)
	wf := func(digest string) Entry {
		return Entry{Kind: KindWorkflow, At: t0, Workflow: &WorkflowDef{Name: "wf", Digest: digest, Spec: json.RawMessage(`{"d":"` + digest + `"}`)}}
	}
	mustApply(t, s, wf("aaa"))
	if w, err := s.Workflow("wf", 0); err != nil || w.Version != 1 { // caches the latest
		t.Fatalf("latest = %+v, %v", w, err)
	}
	mustApply(t, s, wf("aaa")) // unchanged: no new version
	mustApply(t, s, wf("bbb"))
	w, err := s.Workflow("wf", 0)
	if err != nil || w.Version != 2 || w.Digest != "bbb" {
		t.Fatalf("latest = %+v, %v", w, err)
	}
	if w1, err := s.Workflow("wf", 1); err != nil || w1.Digest != "aaa" {
		t.Fatalf("v1 = %+v, %v", w1, err)
	}
	if _, err := s.Workflow("nope", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown workflow: %v", err)
	}
	all, _ := s.Workflows()
	if len(all) != 1 || all[0].Version != 2 {
		t.Fatalf("workflows = %+v", all)
	}
}

func TestEachRunAndCountRuns(t *testing.T) {
	s := memStore(t, nil)
	for i := 0; i < 7; i++ {
		mustApply(t, s, submitEntry(fmt.Sprintf("p%d", i), StepSpec{Name: "one"}))
	}
	var seen []string
	if err := s.EachRun(ListOptions{Status: StatusPending, Limit: 3}, func(r *Run) bool {
		seen = append(seen, r.ID)
		return len(seen) < 5
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(seen, ",") != "p0,p1,p2,p3,p4" {
		t.Fatalf("EachRun across pages, stopping at 5: %v", seen)
	}
	if n, err := s.CountRuns(StatusPending); err != nil || n != 7 {
		t.Fatalf("CountRuns = %d, %v", n, err)
	}
	if n, _ := s.CountRuns(StatusRunning); n != 0 {
		t.Fatalf("running = %d", n)
	}
}

// The cron planner waits on ScheduleChanged: a new workflow version or a recorded tick
// wakes it, run traffic does not (it rescanned every workflow on every message before).
func TestScheduleChangedOnlyForWorkflowsAndTicks(t *testing.T) {
	s := memStore(t, nil)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	ch := s.ScheduleChanged()
	claimedRun(t, s)
	mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: 2, Owner: "a", At: t0})
	if closed(ch) {
		t.Fatal("run entries woke the cron planner")
	}
	mustApply(t, s, Entry{Kind: KindWorkflow, At: t0, Workflow: &WorkflowDef{Name: "wf", Digest: "d1", Spec: json.RawMessage(`{}`)}})
	if !closed(ch) {
		t.Fatal("a new workflow version did not wake the cron planner")
	}
	ch = s.ScheduleChanged()
	mustApply(t, s, Entry{Kind: KindWorkflow, At: t0, Workflow: &WorkflowDef{Name: "wf", Digest: "d1", Spec: json.RawMessage(`{}`)}})
	if closed(ch) {
		t.Fatal("an unchanged workflow (no new version) woke the cron planner")
	}
	mustApply(t, s, Entry{Kind: KindCronTick, Term: 1, At: t0, Tick: &CronTick{Workflow: "wf", At: t0, Outcome: TickMissed}})
	if !closed(ch) {
		t.Fatal("a recorded tick did not wake the cron planner")
	}
}

// A retired run leaves no key behind: record, steps, items, fenced commits, events and
// index entries are all gone, and nothing else changed (another run and the workflow
// keys are untouched). Control: before the retire, the dump holds the run's keys.
func TestRetireLeavesNothing(t *testing.T) {
	s := memStore(t, nil)
	e := claimedRun(t, s)
	mustApply(t, s, submitEntry("other", StepSpec{Name: "one"}))
	for item := range 3 {
		mustApply(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "each", Item: item, Epoch: e, Owner: "a", Output: json.RawMessage(`{}`), At: t0})
	}
	if _, err := applyOne(t, s, Entry{Kind: KindCommit, Run: "r1", Step: "one", Item: ItemWhole, Epoch: e - 1, Owner: "z", At: t0}); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale commit: %v", err)
	}
	mustApply(t, s, Entry{Kind: KindCancel, Run: "r1", Reason: "done", At: t0})
	has := func(d []byte) bool {
		return bytes.Contains(d, []byte(`/r1"`)) || bytes.Contains(d, []byte(`/r1/`)) || bytes.Contains(d, []byte(`"r/r1"`))
	}
	if before := dump(t, s); !has(before) {
		t.Fatal("control: the run's keys are not in the dump: the test shows nothing")
	}
	otherBefore, _ := s.View("other")
	seq := s.Applied() + 1
	verdicts, err := s.Apply(seq, EncodeJSONEnvelope("test", 2, [][]byte{mustJSON(t, Entry{Kind: KindRetire, Run: "r1", Term: 1, At: t0})}))
	if err != nil || verdicts[0] != nil {
		t.Fatalf("retire: %v %v", verdicts, err)
	}
	if after := dump(t, s); has(after) {
		t.Fatalf("keys of the retired run remain:\n%s", after)
	}
	if otherAfter, err := s.View("other"); err != nil || otherAfter.Run.Status != otherBefore.Run.Status {
		t.Fatalf("another run changed: %v", err)
	}
	if got := s.Counters().Retired.Load(); got != 1 {
		t.Fatalf("Retired = %d", got)
	}
	// In format 1 the kind does not exist: such a message is rejected as undecodable.
	if v, err := s.Apply(s.Applied()+1, EncodeJSONEnvelope("test", 1, [][]byte{mustJSON(t, Entry{Kind: KindRetire, Run: "other", Term: 1, At: t0})})); err != nil || len(v) != 0 {
		t.Fatalf("a retire in a format-1 message: %v %v; want the message rejected", v, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every node must refuse a bad entry with the same words: the writer compares its
// Future's verdict with what a peer's apply gives (FuzzOwnMessage found a submit with
// two bad handler events refused for one on one node and the other on the next,
// because the check walked a map).
func TestRefusalIsTheSameEachTime(t *testing.T) {
	e := submitEntry("r1", StepSpec{Name: "a"})
	e.Submit.Handlers = map[string][]StepSpec{}
	for _, ev := range []string{"ailre", "n_deadlin", "on_dea_letr", "zz", "aa", "mm"} {
		e.Submit.Handlers[ev] = []StepSpec{{Name: "h"}}
	}
	first := e.Validate()
	if first == nil || !strings.Contains(first.Error(), `"aa"`) {
		t.Fatalf("Validate = %v, want a refusal naming the first bad event in order, \"aa\"", first)
	}
	for range 50 {
		if err := e.Validate(); err.Error() != first.Error() {
			t.Fatalf("Validate = %v, then %v", first, err)
		}
	}
}
