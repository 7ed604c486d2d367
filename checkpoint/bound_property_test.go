package checkpoint_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/failtb"
)

// Properties of issue 36's rules, over random interleavings, each with the control
// that switches its guard off and must be caught: a parent never takes a run it did not
// start (its child submits are its current epoch's), and four eyes stay four (an
// approval counts only from a distinct person who neither started the run nor changed
// its inputs, and every approval the log accepts while the run waits counts).

// childProperty drives one parent run p, whose owner changes (new epochs, the old owners
// become zombies), through random child starts of step fan: by the current owner, by a
// zombie with its old epoch, by a person under the child's ID (no parent), and by a
// writer naming another step. After every message: every run under p's child IDs that
// checkpoint.ChildOf lets p take was started by p's epoch that was current when it was
// written; and p's children are exactly those runs.
func childProperty(h *testhooks.Hooks) func(*rapid.T) {
	return func(t *rapid.T) {
		s, apply := memApplier(t, h)
		defer s.Close()
		apply(submitEntry("p", checkpoint.StepSpec{Name: "fan", Foreach: true}, checkpoint.StepSpec{Name: "other"}))
		apply(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "p", Term: 1, Worker: "w0"})
		var epochs []int64 // every epoch p had, oldest first
		p, _ := s.Run("p")
		epochs = append(epochs, p.Epoch)
		legit := map[string]bool{} // child IDs the current epoch started
		const items = 4
		for range rapid.IntRange(5, 40).Draw(t, "messages") {
			p, _ := s.Run("p")
			item := rapid.IntRange(0, items-1).Draw(t, "item")
			id := checkpoint.ChildID("p", "fan", item)
			child := checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Owner: "w", Submit: &checkpoint.Submit{Workflow: "settle", Version: 1,
				Trigger: checkpoint.TriggerChild, MaxEpochs: 3, Steps: []checkpoint.StepSpec{{Name: "x"}},
				Parent: &checkpoint.ParentRef{Run: "p", Step: "fan", Item: item}}}
			var e checkpoint.Entry
			current := false
			switch rapid.IntRange(0, 5).Draw(t, "who") {
			case 0: // the owner is presumed dead: a new epoch
				e = checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "p", Epoch: p.Epoch, Term: 1, Worker: fmt.Sprintf("w%d", len(epochs)), Reason: checkpoint.ReasonLeaseExpired}
			case 1, 2: // the current owner starts a child
				e, current = child, true
				e.Epoch = p.Epoch
			case 3: // a zombie of an older epoch starts one
				e = child
				e.Epoch = rapid.SampledFrom(epochs).Draw(t, "zombie-epoch")
				current = e.Epoch == p.Epoch
			case 4: // a person under the child's ID
				e = child
				e.Submit = &checkpoint.Submit{Workflow: "fake", Version: 1, Trigger: checkpoint.TriggerManual, MaxEpochs: 3, Steps: []checkpoint.StepSpec{{Name: "x"}}}
			default: // another step's start under this ID
				e = child
				e.Epoch = p.Epoch
				e.Submit.Parent = &checkpoint.ParentRef{Run: "p", Step: "other", Item: item}
			}
			res := apply(e)
			if e.Kind == checkpoint.KindAssign && res[0] == nil {
				p, _ := s.Run("p")
				epochs = append(epochs, p.Epoch)
			}
			if e.Kind == checkpoint.KindSubmit && res[0] == nil && current && p.Status == checkpoint.StatusRunning {
				legit[id] = true
			}
			p, _ = s.Run("p")
			for i := range items {
				id := checkpoint.ChildID("p", "fan", i)
				r, err := s.Run(id)
				if err != nil {
					continue
				}
				if checkpoint.ChildOf(r, checkpoint.ParentRef{Run: "p", Step: "fan", Item: i}, false) == nil && !legit[id] {
					t.Fatalf("p would take %s, which its current epoch did not start (parent %+v)", id, r.Parent)
				}
			}
			for _, c := range p.Children {
				r, err := s.Run(c)
				if err != nil || r.Parent == nil || r.Parent.Run != "p" {
					t.Fatalf("p's child %s does not name p: %+v (%v)", c, r, err)
				}
				if r.Parent.Step == "fan" && !legit[c] {
					t.Fatalf("p's child %s was started by a stale epoch", c)
				}
			}
		}
	}
}

func TestChildBindingProperty(t *testing.T) {
	setFlag(t, "rapid.checks", propertyChecks)
	rapid.Check(t, childProperty(nil))
}

// approvalProperty parks a run on an approval step (need 1-3, not_the_starter) after a
// retry that changed its inputs, then sends random decisions by random people (the
// starter, the input changer, others, repeats, rejections). After every message: the
// run woke exactly when the distinct approvers the rule allows reached need, or someone
// rejected; and every approval the log accepted while the run waited counts.
func approvalProperty(h *testhooks.Hooks) func(*rapid.T) {
	return func(t *rapid.T) {
		s, apply := memApplier(t, h)
		defer s.Close()
		must := func(entries ...checkpoint.Entry) {
			for i, err := range apply(entries...) {
				if err != nil {
					t.Fatalf("%s: %v", entries[i].Kind, err)
				}
			}
		}
		epoch := func() int64 { r, _ := s.Run("r"); return r.Epoch }
		sub := submitEntry("r", checkpoint.StepSpec{Name: "compute"}, checkpoint.StepSpec{Name: "approve"})
		sub.Actor = "sam"
		must(sub)
		must(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "r", Term: 1, Worker: "w"})
		must(checkpoint.Entry{Kind: checkpoint.KindFail, Run: "r", Epoch: epoch(), Owner: "w", Step: "compute", Item: checkpoint.ItemWhole, Error: "boom", Final: true, Attempt: 1})
		must(checkpoint.Entry{Kind: checkpoint.KindComplete, Run: "r", Epoch: epoch(), Owner: "w", Status: checkpoint.StatusFailed, Error: "boom"})
		changer := rapid.SampledFrom([]string{"otto", "ann"}).Draw(t, "changer")
		must(checkpoint.Entry{Kind: checkpoint.KindRetry, Run: "r", Actor: changer, Steps: []string{"compute", "approve"}, Output: json.RawMessage(`{"cents":999}`)})
		must(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "r", Term: 1, Worker: "w", Epoch: epoch()})
		must(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "r", Epoch: epoch(), Owner: "w", Step: "compute", Item: checkpoint.ItemWhole, Output: json.RawMessage(`{}`)})
		need := rapid.IntRange(1, 3).Draw(t, "need")
		must(checkpoint.Entry{Kind: checkpoint.KindPark, Run: "r", Epoch: epoch(), Owner: "w", Step: "approve", Item: checkpoint.ItemWhole,
			Wait: &checkpoint.Wait{Kind: checkpoint.WaitApproval, Need: need, Exclude: "sam", NotTheStarter: true}})
		var counted []string
		rejected := false
		for range rapid.IntRange(1, 12).Draw(t, "decisions") {
			r, _ := s.Run("r")
			if r.Status != checkpoint.StatusWaiting {
				break
			}
			who := rapid.SampledFrom([]string{"sam", "otto", "ann", "bob", "cat", "dan"}).Draw(t, "who")
			approve := rapid.IntRange(0, 5).Draw(t, "reject") > 0
			res := apply(checkpoint.Entry{Kind: checkpoint.KindDecide, Run: "r", Actor: who, Step: "approve", Item: checkpoint.ItemWhole,
				Decision: &checkpoint.Decision{Approve: approve}})
			counts := approve && who != "sam" && who != changer && !slices.Contains(counted, who)
			switch {
			case res[0] != nil && counts:
				t.Fatalf("%s's approval would count, and the log refused it: %v", who, res[0])
			case res[0] == nil && approve && !counts:
				t.Fatalf("the log accepted %s's approval, which does not count (starter sam, inputs changed by %s, counted %v)", who, changer, counted)
			}
			if counts {
				counted = append(counted, who)
			}
			rejected = rejected || !approve && res[0] == nil
			r, _ = s.Run("r")
			wantAwake := rejected || len(counted) >= need
			if awake := r.Status != checkpoint.StatusWaiting; awake != wantAwake {
				t.Fatalf("after %s's decision the run is %s; counted %v of %d (rejected %v, inputs changed by %s)", who, r.Status, counted, need, rejected, changer)
			}
		}
	}
}

func TestApprovalRulesProperty(t *testing.T) {
	setFlag(t, "rapid.checks", propertyChecks)
	rapid.Check(t, approvalProperty(nil))
}

// The controls: with each guard off, its property finds the damage.
func TestBoundGuardsAreNeeded(t *testing.T) {
	setFlag(t, "rapid.shrinktime", "2s")
	setFlag(t, "rapid.nofailfile", "true")
	setFlag(t, "rapid.checks", propertyChecks)
	for _, c := range []struct {
		name     string
		property func(*testhooks.Hooks) func(*rapid.T)
		hooks    *testhooks.Hooks
		damage   string
	}{
		{"no child epoch check", childProperty, &testhooks.Hooks{NoChildEpochCheck: true}, "which its current epoch did not start"},
		{"no inputs-by exclusion", approvalProperty, &testhooks.Hooks{NoInputsByExclude: true}, "does not count"},
		{"no decision check", approvalProperty, &testhooks.Hooks{NoDecisionCheck: true}, "does not count"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := failtb.New(t)
			rapid.Check(rec, c.property(c.hooks))
			if !rec.Failed() {
				t.Fatalf("with %s the property found no violation: the guard is not shown to matter", c.name)
			}
			if got := strings.Join(rec.Msgs, "\n"); !strings.Contains(got, c.damage) {
				t.Fatalf("with %s the property failed, but not with %q:\n%s", c.name, c.damage, got)
			}
		})
	}
}

// memApplier is a store in memory and a function that applies entries to it as the next
// log message, returning each entry's outcome.
func memApplier(t *rapid.T, h *testhooks.Hooks) (*checkpoint.Store, func(...checkpoint.Entry) []error) {
	s, err := checkpoint.OpenStore("state", checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	return s, func(entries ...checkpoint.Entry) []error {
		for i := range entries {
			entries[i].At = t0
		}
		res, err := s.Apply(s.Applied()+1, msg(t, entries...))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
}
