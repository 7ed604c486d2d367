package checkpoint_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/checkpoint/checkpointtest"
	"github.com/flowrun/flow/checkpoint/invariants"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/failtb"
)

// The property test drives one run through random interleavings of a scheduler (whose
// term sometimes goes stale), three workers that each believe in some epoch (old
// beliefs make them zombies), and an operator, packing 1-3 entries per log message.
// After every message the shared checker (package invariants, which the deterministic
// simulation of engine/internal/sim uses too) checks DESIGN.md's invariants 1, 2, 3 and
// 5, the one owner of an epoch, the term rule, and that nothing claims to run without
// an owner. It is an external test package so that it can import the checker, which
// imports checkpoint.

var owners = []string{"w0", "w1", "w2"}

type model struct {
	s         *checkpoint.Store
	term      int64            // the newest leader's term
	belief    map[string]int64 // each worker's epoch
	check     *invariants.Checker
	maxEpochs int
}

func (m *model) entry(t *rapid.T) checkpoint.Entry {
	owner := rapid.SampledFrom(owners).Draw(t, "owner")
	epoch := m.belief[owner]
	if epoch == 0 {
		epoch = 1 // never assigned: still a syntactically valid (and stale) epoch
	}
	step := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "step")
	item := checkpoint.ItemWhole
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
		reason := rapid.SampledFrom([]string{checkpoint.ReasonLeaseExpired, checkpoint.ReasonReconciled}).Draw(t, "reason")
		e := checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "r", Epoch: r.Epoch, Term: term, Reason: reason}
		if rapid.IntRange(0, 2).Draw(t, "to-worker") == 0 {
			// The leader's own worker takes the epoch in the assign (no claim).
			e.Worker = owner
			m.belief[owner] = int64(m.s.Applied() + 1) // this message's sequence, if accepted
		}
		return e
	case 2:
		// The worker picks up the current epoch's task (its belief catches up).
		m.belief[owner] = r.Epoch
		return checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "r", Epoch: max(r.Epoch, 1), Owner: owner}
	case 3:
		return checkpoint.Entry{Kind: checkpoint.KindStart, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: checkpoint.ItemWhole, Items: 3}
	case 4, 5, 6, 7:
		return checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: item,
			Output: json.RawMessage(fmt.Sprintf(`{"by":%q,"epoch":%d}`, owner, epoch))}
	case 8:
		return checkpoint.Entry{Kind: checkpoint.KindFail, Run: "r", Epoch: epoch, Owner: owner, Step: step, Item: item,
			Error: "boom", Final: rapid.Bool().Draw(t, "final"), Attempt: 1}
	case 9:
		return checkpoint.Entry{Kind: checkpoint.KindComplete, Run: "r", Epoch: epoch, Owner: owner,
			Status: rapid.SampledFrom([]checkpoint.RunStatus{checkpoint.StatusSucceeded, checkpoint.StatusFailed}).Draw(t, "status")}
	case 10:
		return checkpoint.Entry{Kind: checkpoint.KindRequeue, Run: "r", Epoch: epoch, Owner: owner}
	case 11:
		return checkpoint.Entry{Kind: checkpoint.KindRetry, Run: "r"}
	default:
		return checkpoint.Entry{Kind: checkpoint.KindCancel, Run: "r", Reason: "operator"}
	}
}

// checkInvariants checks the message just applied at seq with the shared checker.
func checkInvariants(t *rapid.T, m *model, seq uint64, before invariants.Before, entries []checkpoint.Entry, results []error) {
	if err := m.check.Message(m.s, seq, before, entries, results); err != nil {
		t.Fatal(err)
	}
}

func fencingProperty(h *testhooks.Hooks) func(*rapid.T) {
	return func(t *rapid.T) {
		s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: h})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m := &model{s: s, term: 1, belief: map[string]int64{}, check: invariants.New(),
			maxEpochs: rapid.IntRange(1, 4).Draw(t, "max_epochs")}
		sub := submitEntry("r", checkpoint.StepSpec{Name: "a"}, checkpoint.StepSpec{Name: "b", Foreach: true}, checkpoint.StepSpec{Name: "c"})
		sub.Submit.MaxEpochs = m.maxEpochs
		first, err := s.Apply(1, msg(t, sub))
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, m, 1, invariants.Before{}, []checkpoint.Entry{sub}, first)
		steps := rapid.IntRange(10, 120).Draw(t, "messages")
		for i := 0; i < steps; i++ {
			n := rapid.IntRange(1, 3).Draw(t, "batch")
			entries := make([]checkpoint.Entry, n)
			for j := range entries {
				entries[j] = m.entry(t)
				entries[j].At = t0
			}
			seq := s.Applied() + 1
			before := invariants.ReadBefore(s, entries)
			results, err := s.Apply(seq, msg(t, entries...))
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, m, seq, before, entries, results)
		}
	}
}

// propertyChecks is how many random logs the property and each of its controls try:
// the same number on both sides, so that the holds test tries as hard as a control must
// to find the damage ("no start check" missed it within 100 one run in seven: within 500,
// one in about 20,000).
const propertyChecks = "500"

func TestFencingInvariantsProperty(t *testing.T) {
	setFlag(t, "rapid.checks", propertyChecks)
	rapid.Check(t, fencingProperty(nil))
}

// Negative controls: with each guard switched off, the same property test finds the
// damage the guard exists to prevent. If a guard were not what keeps the invariant, its
// control would pass and this test would fail.
func TestFencingGuardsAreNeeded(t *testing.T) {
	// The controls are meant to fail: keep rapid from spending its default 30 s shrinking
	// each counterexample and from writing fail files for them.
	setFlag(t, "rapid.shrinktime", "2s")
	setFlag(t, "rapid.nofailfile", "true")
	// As many tries as the property itself (propertyChecks): rapid stops at the first
	// violation a control finds.
	setFlag(t, "rapid.checks", propertyChecks)
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
		// A claim of an epoch handed back (requeue) gives the epoch a second owner.
		{"no claim-once check", &testhooks.Hooks{NoClaimOnceCheck: true}, []string{"invariant 8: epoch"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := failtb.New(t)
			rapid.Check(rec, fencingProperty(c.hooks))
			if !rec.Failed() {
				t.Fatalf("with %s the property found no violation: the guard is not shown to matter", c.name)
			}
			got := strings.Join(rec.Msgs, "\n")
			if !slices.ContainsFunc(c.damage, func(d string) bool { return strings.Contains(got, d) }) {
				t.Fatalf("with %s the property failed, but not with any of %q:\n%s", c.name, c.damage, got)
			}
			t.Logf("found: %s", firstLine(rec.Msgs))
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
		a, err := checkpoint.OpenStore("a", checkpoint.StoreOptions{FS: vfs.NewMem()})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := checkpoint.OpenStore(filepath.Join(dir, fmt.Sprint(iteration)), checkpoint.StoreOptions{})
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

var t0 = time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)

// msg encodes entries as one log message.
func msg(t interface{ Fatal(...any) }, entries ...checkpoint.Entry) []byte {
	data, err := checkpoint.EncodeMessage("test", entries...)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func submitEntry(run string, steps ...checkpoint.StepSpec) checkpoint.Entry {
	return checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: run, At: t0, Submit: &checkpoint.Submit{
		Workflow: "wf", Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: 3, Steps: steps,
	}}
}
