package checkpoint

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"
)

var (
	newestIDs       = []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r11", "r12"}
	newestWorkflows = []string{"wf0", "wf1", "wf2"}
	allStatuses     = []RunStatus{StatusPending, StatusRunning, StatusSucceeded, StatusFailed, StatusCancelled, StatusDeadLettered}
)

// newestEntry draws an entry about a run of a small pool (so that IDs come back after a
// retire and resubmits are refused), written from the run's state before the message so
// that most are accepted: submits and fired cron ticks, assigns (to a worker or not),
// claims, commits, completes, cancels, dead letters, retries, purges, requeues, retires.
func newestEntry(t *rapid.T, s *Store, ticks *int) Entry {
	id := rapid.SampledFrom(newestIDs).Draw(t, "run")
	// Mostly a run that exists, so that runs get through their lives.
	if existing := allRuns(t, s); len(existing) > 0 && rapid.IntRange(0, 3).Draw(t, "existing") > 0 {
		id = rapid.SampledFrom(existing).Draw(t, "existing run").ID
	}
	var epoch int64
	owner := "w1"
	if r, err := s.Run(id); err == nil {
		epoch = r.Epoch
		if r.Owner != "" {
			owner = r.Owner
		}
	}
	wf := rapid.SampledFrom(newestWorkflows).Draw(t, "workflow")
	sub := &Submit{Workflow: wf, Version: 1, Trigger: rapid.SampledFrom([]string{TriggerManual, TriggerManual, TriggerRetry, TriggerBackfill}).Draw(t, "trigger"),
		MaxEpochs: 2, Steps: []StepSpec{{Name: "a"}}}
	if v := rapid.IntRange(0, 3).Draw(t, "input"); v > 0 {
		sub.Inputs = json.RawMessage(fmt.Sprintf(`{"k":%q,"n":%d}`, []string{"", "x", "y", "x"}[v], v))
	}
	// Times out of log order too: the writers' clocks differ.
	e := Entry{Run: id, At: t0.Add(time.Duration(rapid.IntRange(0, 40).Draw(t, "minute")) * time.Minute)}
	switch rapid.IntRange(0, 19).Draw(t, "kind") {
	case 0, 1:
		e.Kind, e.Submit = KindSubmit, sub
	case 2:
		*ticks++
		sub.Trigger = TriggerCron
		e.Kind, e.Term, e.Submit = KindCronTick, 1, sub
		e.Tick = &CronTick{Workflow: wf, At: t0.Add(time.Duration(*ticks) * time.Minute), Outcome: TickFired, RunID: id}
	case 3, 4:
		e.Kind, e.Epoch, e.Term, e.Reason = KindAssign, epoch, 1, ReasonLeaseExpired
		if rapid.IntRange(0, 2).Draw(t, "to-worker") > 0 {
			e.Worker = "w1"
		}
	case 5:
		e.Kind, e.Epoch, e.Owner = KindClaim, max(epoch, 1), rapid.SampledFrom([]string{"w1", "w2"}).Draw(t, "owner")
	case 6, 15, 16:
		e.Kind, e.Epoch, e.Owner, e.Step, e.Item = KindCommit, max(epoch, 1), owner, "a", ItemWhole
	case 7, 17, 18, 19:
		e.Kind, e.Epoch, e.Owner = KindComplete, max(epoch, 1), owner
		e.Status = rapid.SampledFrom([]RunStatus{StatusSucceeded, StatusFailed}).Draw(t, "status")
	case 8:
		e.Kind, e.Reason = KindCancel, "operator"
	case 9:
		e.Kind, e.Term, e.Reason = KindDeadLetter, 1, "poison"
	case 10:
		e.Kind = KindRetry
	case 11:
		e.Kind = KindPurge
	case 12:
		e.Kind, e.Epoch, e.Owner = KindRequeue, max(epoch, 1), owner
	default:
		e.Kind, e.Term = KindRetire, 1
	}
	return e
}

// newestLog applies a random log of 1-60 messages of 1-4 entries to s and returns it.
// After each message the indexes hold exactly the keys the runs call for.
func newestLog(t *rapid.T, s *Store) [][]byte {
	n := rapid.IntRange(1, 60).Draw(t, "messages")
	ticks := 0
	var msgs [][]byte
	for range n {
		var datas [][]byte
		version := 1
		for range rapid.IntRange(1, 4).Draw(t, "entries") {
			e := newestEntry(t, s, &ticks)
			version = max(version, RevisionFor(e.Kind))
			raw, err := json.Marshal(e)
			if err != nil {
				t.Fatal(err)
			}
			datas = append(datas, raw)
		}
		m := EncodeJSONEnvelope("test", version, datas)
		if _, err := s.Apply(s.Applied()+1, m); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
		checkNewestKeys(t, s)
	}
	return msgs
}

// randomRuns is a store that applied a random log (newestLog), and its runs (allRuns).
func randomRuns(t *rapid.T) (*Store, []Run) {
	s, err := OpenStore("state", StoreOptions{FS: memFS()})
	if err != nil {
		t.Fatal(err)
	}
	newestLog(t, s)
	return s, allRuns(t, s)
}

// allRuns reads every run from the run table, newest first by the naive rule: submit
// sequence, then ID, descending.
func allRuns(t interface{ Fatal(...any) }, s *Store) []Run {
	var runs []Run
	if err := s.EachRun(ListOptions{}, func(r *Run) bool {
		runs = append(runs, *r)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(runs, func(a, b Run) int {
		return -cmp.Or(cmp.Compare(a.CreatedSeq, b.CreatedSeq), cmp.Compare(a.ID, b.ID))
	})
	return runs
}

// checkNewestKeys compares the b/ d/ g/ tables with the keys the runs in the run
// table call for: a key left behind by a retire or a status change, or one missing,
// fails (and would make a page show a run twice, or in the wrong status, or not at all).
func checkNewestKeys(t interface{ Fatalf(string, ...any) }, s *Store) {
	want := map[string]bool{}
	var runs []Run
	if err := s.EachRun(ListOptions{}, func(r *Run) bool {
		runs = append(runs, *r)
		return true
	}); err != nil {
		t.Fatalf("list runs: %v", err)
	}
	for i := range runs {
		r := &runs[i]
		for _, k := range createdKeys(r) {
			want[string(k)] = true
		}
	}
	got := map[string]bool{}
	for _, table := range append(append([][]byte{}, newestTables...), droppedTables...) {
		if err := scan(s.db, table, nil, func(k, _ []byte) (bool, error) {
			got[string(k)] = true
			return true, nil
		}); err != nil {
			t.Fatalf("scan: %v", err)
		}
	}
	for k := range got {
		if !want[k] {
			t.Fatalf("index key %q names no run in that place (left behind?)", k)
		}
	}
	for k := range want {
		if !got[k] {
			t.Fatalf("index key %q is missing", k)
		}
	}
	if at, found, err := s.getUintFound(keyNewestAt); err != nil || !found || at != s.Applied() {
		t.Fatalf("m/index-newest = %d (found %v, %v), applied %d", at, found, err, s.Applied())
	}
}

// Property: for random logs with retries, cancels, dead letters, purges, fired cron
// ticks and retires, RunsWithIDPrefix gives the runs an ID-ordered scan finds.
// (QueryRuns has its own property: listing_test.go.)
func TestRunsWithIDPrefixMatchesAScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s, runs := randomRuns(t)
		defer s.Close()
		prefix := rapid.SampledFrom([]string{"", "r", "r1", "r10", "r2", "x"}).Draw(t, "id prefix")
		limit := rapid.IntRange(0, 5).Draw(t, "id limit")
		var want []string
		slices.SortFunc(runs, func(a, b Run) int { return cmp.Compare(a.ID, b.ID) })
		for _, r := range runs {
			if strings.HasPrefix(r.ID, prefix) && len(want) < pageLimit(limit) {
				want = append(want, r.ID)
			}
		}
		found, err := s.RunsWithIDPrefix(prefix, limit)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range found {
			got = append(got, r.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("RunsWithIDPrefix(%q, %d) = %v, want %v", prefix, limit, got, want)
		}
	})
}

// stripNewestIndex makes s a state of the flowd before the newest-first indexes: their
// keys and m/index-newest deleted through the store's own Pebble.
func stripNewestIndex(t interface{ Fatal(...any) }, s *Store) {
	b := s.db.NewBatch()
	defer b.Close()
	for _, table := range newestTables {
		if err := scan(s.db, table, nil, func(k, _ []byte) (bool, error) {
			return true, b.Delete(k, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.Delete(keyNewestAt, nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
}

// A state of an older flowd (no newest-first indexes, no m/index-newest) is indexed when
// it is opened, in batches, and then equals a fresh replay of its log key for key; so
// does one restored from such a state's snapshot, and one where an older flowd applied
// messages after the index was built (m/index-newest behind, keys stale). Control: the
// stripped state differs from the replay.
func TestOpenBuildsTheNewestIndex(t *testing.T) {
	old := indexBuildBatch
	t.Cleanup(func() { indexBuildBatch = old })
	indexBuildBatch = 7 // several batches for a few dozen runs
	rapid.Check(t, func(t *rapid.T) {
		fs := vfs.NewMem()
		s, err := OpenStore("old", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { s.Close() }() // the store open at the end (it is reopened)
		msgs := newestLog(t, s)
		fresh, err := OpenStore("fresh", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer fresh.Close()
		for i, m := range msgs {
			if _, err := fresh.Apply(uint64(i+1), m); err != nil {
				t.Fatal(err)
			}
		}
		want := dump(t, fresh)

		stripNewestIndex(t, s)
		if bytes.Equal(dump(t, s), want) {
			t.Fatal("control: the stripped state equals the replay: the test shows nothing")
		}
		var snap bytes.Buffer
		if _, err := s.WriteSnapshot(&snap); err != nil {
			t.Fatal(err)
		}
		// An older flowd's later messages: the index misses a run and holds a key of no
		// run, and m/index-newest is behind m/applied.
		if rapid.Bool().Draw(t, "downgraded") {
			b := s.db.NewBatch()
			_ = b.Set(createdKeys(&Run{ID: "gone", CreatedSeq: 1})[0], nil, nil)
			_ = b.Set([]byte("n/\x00\x00\x00\x00\x00\x00\x00\x01gone"), nil, nil) // a key of the dropped seq-ordered index
			_ = b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, s.Applied()-1), nil)
			if err := b.Commit(pebble.Sync); err != nil {
				t.Fatal(err)
			}
			b.Close()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if s, err = OpenStore("old", StoreOptions{FS: fs}); err != nil {
			t.Fatal(err)
		}
		if got := dump(t, s); !bytes.Equal(got, want) {
			t.Fatalf("the old state, opened, differs from a fresh replay:\n%s\nwant\n%s", got, want)
		}
		if _, err := RestoreSnapshot("restored", &snap, fs); err != nil {
			t.Fatal(err)
		}
		r, err := OpenStore("restored", StoreOptions{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if got := dump(t, r); !bytes.Equal(got, want) {
			t.Fatalf("the old snapshot, restored and opened, differs from a fresh replay:\n%s\nwant\n%s", got, want)
		}
	})
}

// Cursors come back from clients: a malformed one, a bad status or workflow is an
// ErrInvalidEntry that says what to pass, never a panic or a seek to garbage; a page
// size is capped at 10,000; a search prefix no run ID can start is refused.
func TestQueryRunsCursorsAndLimits(t *testing.T) {
	s := memStore(t, nil)
	var datas [][]byte
	for i := range 1100 {
		datas = append(datas, mustJSON(t, submitEntry(fmt.Sprintf("run-%04d", i))))
	}
	if _, err := s.Apply(1, EncodeEnvelope("test", datas)); err != nil {
		t.Fatal(err)
	}
	page, next, err := s.QueryRuns(RunQuery{})
	if err != nil || len(page) != 50 || page[0].ID != "run-1099" || next == "" {
		t.Fatalf("first page: %d runs, first %q, next %q, %v", len(page), page[0].ID, next, err)
	}
	if page, _, err := s.QueryRuns(RunQuery{Limit: 50000}); err != nil || len(page) != 1100 {
		t.Fatalf("a page of 50000: %d runs, %v; want all 1100", len(page), err)
	}
	r1, _ := s.Run("run-0001")
	valid := hex.EncodeToString(createdPos(r1))
	if page, next, err := s.QueryRuns(RunQuery{After: valid}); err != nil || len(page) != 1 || page[0].ID != "run-0000" || next != "" {
		t.Fatalf("the page after run-0001: %v %q %v", page, next, err)
	}
	for name, c := range map[string]string{
		"not hex":        "zz",
		"odd length":     valid[1:],
		"too short":      "00000000000000010000000000000001",
		"bad run ID":     hex.EncodeToString(createdPos(&Run{ID: "a/b", CreatedSeq: 1})),
		"run ID /":       hex.EncodeToString(createdPos(&Run{ID: "/", CreatedSeq: 1})),
		"a run ID, bare": "run-0001",
		"huge":           strings.Repeat("ab", 100000),
	} {
		_, _, err := s.QueryRuns(RunQuery{After: c})
		if !errors.Is(err, ErrInvalidEntry) || !strings.Contains(err.Error(), "unchanged") {
			t.Errorf("%s: %v; want ErrInvalidEntry saying what to pass", name, err)
		}
		if err != nil && len(err.Error()) > 400 {
			t.Errorf("%s: the error repeats the whole cursor (%d bytes)", name, len(err.Error()))
		}
	}
	if _, _, err := s.QueryRuns(RunQuery{Statuses: []RunStatus{"done"}}); !errors.Is(err, ErrInvalidEntry) || !strings.Contains(err.Error(), "use pending, running") {
		t.Errorf("bad status: %v", err)
	}
	if _, _, err := s.QueryRuns(RunQuery{Workflow: "wf/pending"}); !errors.Is(err, ErrInvalidEntry) {
		t.Errorf("bad workflow: %v", err)
	}
	if runs, err := s.RunsWithIDPrefix("run-01", 0); err != nil || len(runs) != 50 || runs[0].ID != "run-0100" {
		t.Fatalf("prefix run-01: %d runs, %v", len(runs), err)
	}
	if runs, err := s.RunsWithIDPrefix("run-000", 3); err != nil || len(runs) != 3 || runs[2].ID != "run-0002" {
		t.Fatalf("prefix run-000, 3: %v, %v", runs, err)
	}
	for _, p := range []string{"run-0.", "a"} {
		if _, err := s.RunsWithIDPrefix(p, 0); err != nil {
			t.Errorf("prefix %q (some ID can start so): %v", p, err)
		}
	}
	for _, p := range []string{"a/b", "-a", "a..", "run 1"} {
		if _, err := s.RunsWithIDPrefix(p, 0); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("prefix %q: %v; want ErrInvalidEntry", p, err)
		}
	}
}

// A page is read from one snapshot while the applier goes on: each run it returns is in
// the status the page was asked for, although the applier moves runs out of that status
// (and retires them) meanwhile.
func TestQueryRunsWhileApplying(t *testing.T) {
	s := memStore(t, nil)
	var datas [][]byte
	for i := range 300 {
		datas = append(datas, mustJSON(t, submitEntry(fmt.Sprintf("run-%03d", i))))
	}
	if _, err := s.Apply(1, EncodeEnvelope("test", datas)); err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	for i := range 300 {
		id := fmt.Sprintf("run-%03d", i)
		cancel := mustJSON(t, Entry{Kind: KindCancel, Run: id, Reason: "r", At: t0})
		retire := mustJSON(t, Entry{Kind: KindRetire, Run: id, Term: 1, At: t0})
		msgs = append(msgs, EncodeJSONEnvelope("test", 2, [][]byte{cancel, retire}))
	}
	done := make(chan error, 1)
	go func() {
		for _, m := range msgs {
			if _, err := s.Apply(s.Applied()+1, m); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for reading := true; reading; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			reading = false
		default:
		}
		opts := RunQuery{Statuses: []RunStatus{StatusPending}, Limit: 7}
		for {
			page, next, err := s.QueryRuns(opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range page {
				if r.Status != StatusPending {
					t.Fatalf("a page of pending runs holds %s, %s", r.ID, r.Status)
				}
			}
			if next == "" {
				break
			}
			opts.After = next
		}
	}
	if page, next, err := s.QueryRuns(RunQuery{}); err != nil || len(page) != 0 || next != "" {
		t.Fatalf("after every run was retired: %d runs, %q, %v", len(page), next, err)
	}
}
