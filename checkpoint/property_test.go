package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint/checkpointtest"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// The property test drives one run through random interleavings of a scheduler (whose
// term sometimes goes stale), three workers that each believe in some epoch (old
// beliefs make them zombies), and an operator, packing 1-3 entries per log message.
// After every message it checks DESIGN.md's invariants 1, 2, 3 and 5 and that nothing
// claims to run without an owner.

var owners = []string{"w0", "w1", "w2"}

type model struct {
	s         *Store
	term      int64            // the newest leader's term
	belief    map[string]int64 // each worker's epoch
	accepted  map[string]int   // accepted commits per step/item
	curEpoch  int64            // the epoch as the accepted assigns made it
	highTerm  int64
	dlSeen    bool // the run entered the DLQ through an assign
	maxEpochs int
}

func stepItem(step string, item int) string { return fmt.Sprintf("%s/%d", step, item) }

func (m *model) entry(t *rapid.T) Entry {
	owner := rapid.SampledFrom(owners).Draw(t, "owner")
	epoch := m.belief[owner]
	if epoch == 0 {
		epoch = 1 // never assigned: still a syntactically valid (and stale) epoch
	}
	step := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "step")
	item := ItemWhole
	if step == "b" && rapid.IntRange(0, 3).Draw(t, "whole") > 0 {
		item = rapid.IntRange(0, 2).Draw(t, "item")
	}
	r, _ := m.s.Run("r")
	switch rapid.IntRange(0, 12).Draw(t, "kind") {
	case 0, 1:
		term := m.term
		if rapid.IntRange(0, 4).Draw(t, "stale-term") == 0 && term > 1 {
			term-- // a deposed leader still scheduling
		}
		if rapid.IntRange(0, 5).Draw(t, "new-term") == 0 {
			m.term++
		}
		reason := rapid.SampledFrom([]string{ReasonLeaseExpired, ReasonReconciled}).Draw(t, "reason")
		e := Entry{Kind: KindAssign, Run: "r", Epoch: r.Epoch, Term: term, Reason: reason}
		if rapid.IntRange(0, 2).Draw(t, "to-worker") == 0 {
			// The leader's own worker takes the epoch in the assign (no claim).
			e.Worker = owner
			m.belief[owner] = int64(m.s.Applied() + 1) // this message's sequence, if accepted
		}
		return e
	case 2:
		// The worker picks up the current epoch's task (its belief catches up).
		m.belief[owner] = r.Epoch
		return Entry{Kind: KindClaim, Run: "r", Epoch: max(r.Epoch, 1), Owner: owner}
	case 3:
		return Entry{Kind: KindStart, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: ItemWhole, Items: 3}
	case 4, 5, 6, 7:
		return Entry{Kind: KindCommit, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: item,
			Output: json.RawMessage(fmt.Sprintf(`{"by":%q,"epoch":%d}`, owner, epoch))}
	case 8:
		return Entry{Kind: KindFail, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: item,
			Error: "boom", Final: rapid.Bool().Draw(t, "final"), Attempt: 1}
	case 9:
		return Entry{Kind: KindComplete, Run: "r", Epoch: epoch, Owner: owner,
			Status: rapid.SampledFrom([]RunStatus{StatusSucceeded, StatusFailed}).Draw(t, "status")}
	case 10:
		return Entry{Kind: KindRequeue, Run: "r", Epoch: epoch, Owner: owner}
	case 11:
		return Entry{Kind: KindRetry, Run: "r"}
	default:
		return Entry{Kind: KindCancel, Run: "r", Reason: "operator"}
	}
}

func checkInvariants(t *rapid.T, m *model, seq uint64, before *Run, entries []Entry, results []error) {
	for i, e := range entries {
		err := results[i]
		if err == nil && e.Term > 0 && e.Term < m.highTerm {
			t.Fatalf("stale term accepted: %s with term %d after term %d (seq %d)", e.Kind, e.Term, m.highTerm, seq)
		}
		if e.Term > 0 && err == nil { // only an accepted entry raises the term
			m.highTerm = max(m.highTerm, e.Term)
		}
		switch e.Kind {
		case KindAssign:
			if err == nil {
				m.curEpoch = int64(seq)
			}
			if errors.Is(err, ErrDeadLettered) {
				m.dlSeen = true
			}
		case KindCommit:
			if err != nil {
				continue
			}
			// Invariant 2: an accepted commit carries the run's current epoch.
			if e.Epoch != m.curEpoch {
				t.Fatalf("invariant 2: commit of %s by %s with epoch %d accepted while the run's epoch is %d (seq %d)",
					stepItem(e.Step, e.Item), e.Owner, e.Epoch, m.curEpoch, seq)
			}
			// Invariant 1: no (step, item) has two accepted commits.
			k := stepItem(e.Step, e.Item)
			m.accepted[k]++
			if m.accepted[k] > 1 {
				t.Fatalf("invariant 1: double commit of %s (second by %s, epoch %d, seq %d)", k, e.Owner, e.Epoch, seq)
			}
		case KindStart:
			// Invariant 3: a step with a checkpoint is never started again.
			if err == nil && m.accepted[stepItem(e.Step, ItemWhole)] > 0 {
				t.Fatalf("invariant 3: step %s started again after its checkpoint (seq %d)", e.Step, seq)
			}
		}
		if err == nil && e.Kind != KindRetry && before.Status == StatusDeadLettered && i == 0 {
			t.Fatalf("invariant 5: %s accepted on a dead-lettered run", e.Kind)
		}
	}
	r, err := m.s.Run("r")
	if err != nil {
		t.Fatal(err)
	}
	if r.Epoch != m.curEpoch && m.curEpoch != 0 {
		t.Fatalf("run epoch %d, accepted assigns say %d", r.Epoch, m.curEpoch)
	}
	// Invariant 5: epoch changes never exceed max_epochs; past it the run is in the DLQ.
	if r.EpochChanges > r.MaxEpochs {
		t.Fatalf("invariant 5: %d epoch changes > max_epochs %d, status %s", r.EpochChanges, r.MaxEpochs, r.Status)
	}
	for _, err := range results {
		if errors.Is(err, ErrDeadLettered) && r.Status != StatusDeadLettered && !anyAcceptedRetry(entries, results) {
			t.Fatalf("invariant 5: assign dead-lettered the run but its status is %s", r.Status)
		}
	}
	// Nothing claims to be running without an owner.
	if r.Status == StatusRunning && r.Owner == "" {
		t.Fatalf("run is running without an owner")
	}
	steps, _ := m.s.Steps("r")
	for _, st := range steps {
		if st.Status == StepRunning && r.Status != StatusRunning {
			t.Fatalf("step %s is running while the run is %s", st.Name, r.Status)
		}
		if st.Foreach {
			items, _ := m.s.Items("r", st.Name)
			if len(items) != st.ItemsDone {
				t.Fatalf("step %s: %d item checkpoints, items_done %d", st.Name, len(items), st.ItemsDone)
			}
		}
	}
}

func anyAcceptedRetry(entries []Entry, results []error) bool {
	for i, e := range entries {
		if e.Kind == KindRetry && results[i] == nil {
			return true
		}
	}
	return false
}

func fencingProperty(h *testhooks.Hooks) func(*rapid.T) {
	return func(t *rapid.T) {
		s, err := OpenStore("state", StoreOptions{FS: memFS(), Hooks: h})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m := &model{s: s, term: 1, belief: map[string]int64{}, accepted: map[string]int{},
			maxEpochs: rapid.IntRange(1, 4).Draw(t, "max_epochs")}
		sub := submitEntry("r", StepSpec{Name: "a"}, StepSpec{Name: "b", Foreach: true}, StepSpec{Name: "c"})
		sub.Submit.MaxEpochs = m.maxEpochs
		if _, err := s.Apply(1, msg(t, sub)); err != nil {
			t.Fatal(err)
		}
		steps := rapid.IntRange(10, 120).Draw(t, "messages")
		for i := 0; i < steps; i++ {
			before, _ := s.Run("r")
			n := rapid.IntRange(1, 3).Draw(t, "batch")
			entries := make([]Entry, n)
			for j := range entries {
				entries[j] = m.entry(t)
				entries[j].At = t0
			}
			seq := s.Applied() + 1
			results, err := s.Apply(seq, msg(t, entries...))
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, m, seq, before, entries, results)
		}
	}
}

func TestFencingInvariantsProperty(t *testing.T) {
	rapid.Check(t, fencingProperty(nil))
}

// recordingTB lets a negative control run a property and see it fail.
type recordingTB struct {
	testing.TB
	failed bool
	msgs   []string
}

func (r *recordingTB) Helper()                   {}
func (r *recordingTB) Logf(string, ...any)       {}
func (r *recordingTB) Log(...any)                {}
func (r *recordingTB) Fail()                     { r.failed = true }
func (r *recordingTB) Failed() bool              { return r.failed }
func (r *recordingTB) Error(a ...any)            { r.fail(fmt.Sprint(a...)) }
func (r *recordingTB) Errorf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }
func (r *recordingTB) Fatal(a ...any)            { r.fail(fmt.Sprint(a...)) }
func (r *recordingTB) Fatalf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }
func (r *recordingTB) fail(m string)             { r.failed = true; r.msgs = append(r.msgs, m) }
func (r *recordingTB) FailNow()                  { r.failed = true }
func (r *recordingTB) Skip(...any)               {}
func (r *recordingTB) Skipf(string, ...any)      {}
func (r *recordingTB) SkipNow()                  {}
func (r *recordingTB) Name() string              { return "negative-control" }

// Negative controls: with each guard switched off, the same property test finds the
// damage the guard exists to prevent. If a guard were not what keeps the invariant, its
// control would pass and this test would fail.
func TestFencingGuardsAreNeeded(t *testing.T) {
	// The controls are meant to fail: keep rapid from spending its default 30 s shrinking
	// each counterexample and from writing fail files for them.
	setFlag(t, "rapid.shrinktime", "2s")
	setFlag(t, "rapid.nofailfile", "true")
	// More tries than the default 100: a control must find its damage every time, and
	// rapid stops at the first it finds (one run in seven or so of "no start check" did
	// not meet it within 100).
	setFlag(t, "rapid.checks", "2000")
	for _, c := range []struct {
		name   string
		hooks  *testhooks.Hooks
		damage []string // any one of them is the damage the guard prevents
	}{
		{"no epoch check", &testhooks.Hooks{NoEpochCheck: true}, []string{"invariant 2"}},
		// Without the checkpoint check the first damage rapid meets is either a second
		// commit of a (step, item), or a final fail accepted over a checkpoint, which a
		// retry then turns back into a pending step that starts again.
		{"no checkpoint check", &testhooks.Hooks{NoCheckpointCheck: true},
			[]string{"invariant 1: double commit", "invariant 3: step"}},
		{"no term check", &testhooks.Hooks{NoTermCheck: true}, []string{"stale term accepted"}},
		// A start accepted for a checkpointed step sets it running again, and the
		// checkpoint check then lets a second commit of it through.
		{"no start check", &testhooks.Hooks{NoStartCheck: true}, []string{"invariant 1: double commit", "invariant 3: step"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := &recordingTB{TB: t}
			rapid.Check(rec, fencingProperty(c.hooks))
			if !rec.failed {
				t.Fatalf("with %s the property found no violation: the guard is not shown to matter", c.name)
			}
			got := strings.Join(rec.msgs, "\n")
			if !slices.ContainsFunc(c.damage, func(d string) bool { return strings.Contains(got, d) }) {
				t.Fatalf("with %s the property failed, but not with any of %q:\n%s", c.name, c.damage, got)
			}
			t.Logf("found: %s", firstLine(rec.msgs))
		})
	}
}

func setFlag(t *testing.T, name, value string) {
	old := flag.Lookup(name).Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}

func firstLine(msgs []string) string {
	for _, m := range msgs {
		for _, l := range strings.Split(m, "\n") {
			if strings.Contains(l, "invariant") || strings.Contains(l, "stale term") {
				return strings.TrimSpace(l)
			}
		}
	}
	return ""
}

// Determinism: one random log replayed into two fresh stores (one in memory, one on
// disk) gives identical state dumps.
func TestReplayIsDeterministic(t *testing.T) {
	dir := t.TempDir()
	iteration := 0
	rapid.Check(t, func(t *rapid.T) {
		iteration++
		seed := rapid.Uint64().Draw(t, "seed")
		msgs := checkpointtest.RandomLog(seed, rapid.IntRange(1, 120).Draw(t, "messages"))
		a, err := OpenStore("a", StoreOptions{FS: memFS()})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := OpenStore(filepath.Join(dir, fmt.Sprint(iteration)), StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for i, m := range msgs {
			ra, errA := a.Apply(uint64(i+1), m)
			rb, errB := b.Apply(uint64(i+1), m)
			if errA != nil || errB != nil {
				t.Fatalf("apply %d: %v / %v", i+1, errA, errB)
			}
			if fmt.Sprint(ra) != fmt.Sprint(rb) {
				t.Fatalf("message %d: outcomes differ: %v vs %v", i+1, ra, rb)
			}
		}
		var da, db bytes.Buffer
		if err := a.Dump(&da); err != nil {
			t.Fatal(err)
		}
		if err := b.Dump(&db); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(da.Bytes(), db.Bytes()) {
			t.Fatalf("dumps differ after %d messages", len(msgs))
		}
		if da.Len() == 0 {
			t.Fatalf("empty dump")
		}
	})
}
