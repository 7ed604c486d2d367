package leader

import (
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"pgregory.net/rapid"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/specs"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/failtb"
	"github.com/flowrun/flow/workflow"
)

// keyWorld is a model of what the leader cannot see directly: the real leases (a run
// can run a step only while its owner holds one, from before its claim until it is
// released or lapses), a lease watch that lags behind them, the leader's own assigns
// that its state has not applied yet, and new terms (a new leader with a fresh watch).
// The leader's side is the real thing: a checkpoint store the entries are applied to,
// PlanAssign and one slotCounter per term.
type keyWorld struct {
	t     *rapid.T
	s     *checkpoint.Store
	specs *specs.Cache
	slots *slotCounter
	// cursor is the term's place in the store's ring of released runs.
	cursor uint64
	guards keyGuards
	term   int64
	// unapplied are the leaders' assign messages written to the log and not yet applied
	// to the state (they are applied, in order, before anything written after them);
	// written and applied count such messages, and reliesOn is how many of them the
	// leader must see applied before it counts (SlotView.Unapplied): the log's end at
	// its term's start, then its own.
	unapplied [][]checkpoint.Entry
	written   int
	applied   int
	reliesOn  int
	now       time.Time
	asOf      time.Time // the watch is caught up as of this
	// leases: run -> when its lease was written and (zero: not yet) when it ended.
	leases map[string]*modelLease
	keyOf  map[string]string
	runs   []string
	// slotted are the runs of paystep (its step b holds the key, not the run); inStep
	// those whose owner runs step b now (under the lease it holds).
	slotted map[string]bool
	inStep  map[string]bool
}

type modelLease struct{ made, ended time.Time }

// keyGuards switch off one guard each (the controls).
type keyGuards struct {
	noDrain     bool // SlotView.NoDrain: the state's holders alone
	noUnapplied bool // SlotView.Unapplied never set: count while own assigns are unapplied
	noBarrier   bool // a new term's counter without its barrier (the term's start)
	noTermTail  bool // a new leader does not wait for the last leader's assigns to apply
	noStepDrain bool // Hooks.NoStepDrain: a step slot released by a cancel is free at once
	// steps: half the runs started are paystep runs (the key on a step). The workflow
	// keys' controls run without them: they would dilute the interleavings that show
	// those guards' damage.
	steps bool
}

const keyLimit = 1

func newKeyWorld(t *rapid.T, dir string, guards keyGuards) *keyWorld {
	s, err := checkpoint.OpenStore(dir, checkpoint.StoreOptions{FS: vfs.NewMem(), Hooks: &testhooks.Hooks{NoStepDrain: guards.noStepDrain}})
	if err != nil {
		t.Fatal(err)
	}
	w := &keyWorld{t: t, s: s, specs: specs.New(s), slots: newSlotCounter(t0.Add(-time.Hour)), guards: guards, term: 1, now: t0,
		asOf: t0.Add(-time.Millisecond), leases: map[string]*modelLease{}, keyOf: map[string]string{}, slotted: map[string]bool{}, inStep: map[string]bool{}}
	for _, src := range []string{
		fmt.Sprintf("name: pay\nconcurrency: {key: \"{{ inputs.acct }}\", limit: %d}\nsteps:\n  - {name: a, uses: noop}\n", keyLimit),
		// The same key on a step: a step's slot and a run's exclude each other.
		fmt.Sprintf("name: paystep\nsteps:\n  - {name: a, uses: noop}\n  - {name: b, uses: noop, needs: [a], concurrency: {key: \"{{ inputs.acct }}\", limit: %d}}\n", keyLimit),
	} {
		wf, err := workflow.Load("wf.yaml", []byte(src), func(string) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		spec, _ := json.Marshal(wf)
		_ = w.apply(checkpoint.Entry{Kind: checkpoint.KindWorkflow, Owner: "api", Workflow: &checkpoint.WorkflowDef{Name: wf.Name, Digest: wf.Digest, Spec: spec}})
	}
	return w
}

func (w *keyWorld) tick() { w.now = w.now.Add(time.Millisecond) }

// apply writes entries as one message, after the leader's unapplied ones, and applies
// them all; it returns the entries' verdicts.
func (w *keyWorld) apply(es ...checkpoint.Entry) []error {
	w.applyUnapplied()
	return w.applyNow(es...)
}

// applyNow applies entries as one message, ahead of the leader's unapplied ones: they
// reached the log first.
func (w *keyWorld) applyNow(es ...checkpoint.Entry) []error {
	for i := range es {
		es[i].At = w.now
	}
	msg, err := checkpoint.EncodeMessage("model", es...)
	if err != nil {
		w.t.Fatal(err)
	}
	verdicts, err := w.s.Apply(w.s.Applied()+1, msg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.tick()
	return verdicts
}

// applyUnapplied lets the state catch up with the leader's assigns in the log.
func (w *keyWorld) applyUnapplied() {
	for len(w.unapplied) > 0 {
		es := w.unapplied[0]
		w.unapplied = w.unapplied[1:]
		w.applied++
		w.applyNow(es...)
	}
}

// behind says whether the state has not applied what the leader relies on.
func (w *keyWorld) behind() bool { return w.applied < w.reliesOn }

// newTerm is a new leader: a counter from the term's start (the barrier), the release
// ring read from where the state is now, and a fresh watch, caught up as of nothing.
// What the old leader wrote and its state had not applied is still in the log.
func (w *keyWorld) newTerm() {
	w.term++
	barrier := w.now
	if w.guards.noBarrier {
		barrier = time.Time{}
	}
	w.slots = newSlotCounter(barrier)
	w.cursor = w.s.ReleaseCursor()
	w.reliesOn = 0
	if !w.guards.noTermTail {
		w.reliesOn = w.written // the log's end now: what the last leader wrote
	}
	w.asOf = t0.Add(-time.Millisecond)
	w.tick()
}

func (w *keyWorld) run(id string) *checkpoint.Run {
	r, err := w.s.Run(id)
	if err != nil {
		w.t.Fatalf("run %s: %v", id, err)
	}
	return r
}

// live is the watch's view: leases written before asOf and not seen ended by then.
func (w *keyWorld) live() []string {
	var out []string
	for _, id := range w.runs {
		if l := w.leases[id]; l != nil && l.made.Before(w.asOf) && (l.ended.IsZero() || !l.ended.Before(w.asOf)) {
			out = append(out, id)
		}
	}
	return out
}

// pass is one leader pass: count once, grant step slots, plan, write the wakes and
// assigns (their applying may lag), as termServices.assignPending does.
func (w *keyWorld) pass() {
	var counts KeyCounts
	counted, canCount := false, false
	slots := func() (KeyCounts, bool) {
		if counted {
			return counts, canCount
		}
		counted = true
		released, next, complete := w.s.Released(w.cursor)
		w.cursor = next
		counts, canCount = w.slots.Count(SlotView{Holders: w.s.KeyHolders(nil), Released: released, ReleasedComplete: complete, Live: w.live(),
			AsOf: w.asOf, Now: w.now, Unapplied: w.behind() && !w.guards.noUnapplied, NoDrain: w.guards.noDrain,
			StepKeys: func(id string) []workflow.KeyLimit { return slotKeys(w.s.SlotKeysOf(id)) }, StepHolders: w.s.SlotHolders()},
			func(id string) []workflow.KeyLimit { return RunKeys(w.specs, w.run(id)) })
		return counts, canCount
	}
	if waiters := w.s.SlotWaiters(); len(waiters) > 0 {
		if c, ok := slots(); ok {
			for _, g := range PlanGrants(waiters, c) {
				e := GrantEntry(g)
				e.Term, e.Owner = w.term, "leader"
				w.unapplied = append(w.unapplied, []checkpoint.Entry{e})
				w.written++
				w.reliesOn = w.written
			}
		}
	}
	plan, err := PlanAssign(w.s, w.specs, 4, PlanOptions{Slots: slots, Taken: w.slots.admitted})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, r := range plan {
		w.unapplied = append(w.unapplied, []checkpoint.Entry{{Kind: checkpoint.KindAssign, Run: r.ID, Epoch: r.Epoch, Term: w.term, Owner: "leader"}})
		w.written++
		w.reliesOn = w.written
	}
	w.tick()
}

// running are the runs whose owner may be running a keyed step now: their lease is held
// (and, for a paystep run, its owner is in step b).
func (w *keyWorld) running() map[string][]string {
	byKey := map[string][]string{}
	for _, id := range w.runs {
		if l := w.leases[id]; l != nil && l.ended.IsZero() && (!w.slotted[id] || w.inStep[id]) {
			byKey[w.keyOf[id]] = append(byKey[w.keyOf[id]], id)
		}
	}
	return byKey
}

func (w *keyWorld) step(t *rapid.T) {
	pick := func(label string, ok func(r *checkpoint.Run, l *modelLease) bool) (string, bool) {
		var ids []string
		for _, id := range w.runs {
			if ok(w.run(id), w.leases[id]) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return "", false
		}
		return rapid.SampledFrom(ids).Draw(t, label), true
	}
	switch rapid.IntRange(0, 11).Draw(t, "event") {
	case 0: // a run is started
		if len(w.runs) >= 12 {
			return
		}
		id := fmt.Sprintf("r%d", len(w.runs))
		acct := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "acct")
		in, _ := json.Marshal(map[string]string{"acct": acct})
		sub := &checkpoint.Submit{Workflow: "pay", Version: 1, Trigger: checkpoint.TriggerManual, Inputs: in, Steps: []checkpoint.StepSpec{{Name: "a"}}}
		slotted := w.guards.steps && rapid.Bool().Draw(t, "step key")
		if slotted {
			sub.Workflow, sub.Steps = "paystep", []checkpoint.StepSpec{{Name: "a"}, {Name: "b"}}
		}
		if err := w.apply(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Owner: "api", Submit: sub})[0]; err != nil {
			t.Fatalf("submit %s: %v", id, err)
		}
		w.runs = append(w.runs, id)
		w.keyOf[id] = acct
		w.slotted[id] = slotted
	case 1, 2: // the leader's pass
		w.pass()
	case 3: // a worker takes an assigned run: its lease first, then its claim
		id, ok := pick("take", func(r *checkpoint.Run, l *modelLease) bool {
			return r.Status == checkpoint.StatusPending && !r.NeedsAssign() && (l == nil || !l.ended.IsZero())
		})
		if !ok {
			return
		}
		w.leases[id] = &modelLease{made: w.now}
		w.tick()
		r := w.run(id)
		if err := w.apply(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: id, Epoch: r.Epoch, Owner: "w"})[0]; err != nil {
			w.leases[id].ended = w.now // refused: the worker lets go
			w.tick()
		} else {
			// A new epoch: in step b at once if it holds the slot (a resumed epoch after
			// its grant, or a takeover), else not (yet).
			w.inStep[id] = w.slotted[id] && w.run(id).HoldsSlots("b", []checkpoint.SlotKey{{Key: w.keyOf[id], Limit: keyLimit}})
		}
	case 4: // the owner finishes its run, and lets go of its lease
		id, ok := pick("finish", func(r *checkpoint.Run, l *modelLease) bool {
			return r.Status == checkpoint.StatusRunning && l != nil && l.ended.IsZero()
		})
		if !ok {
			return
		}
		r := w.run(id)
		if w.slotted[id] {
			w.stepSlotted(id, r)
			return
		}
		w.apply(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: id, Epoch: r.Epoch, Owner: "w", Step: "a", Item: checkpoint.ItemWhole, Output: json.RawMessage(`{}`)})
		w.leases[id].ended = w.now
		w.tick()
	case 5: // an operator cancels a run; its owner (paused, perhaps) holds its lease on
		id, ok := pick("cancel", func(r *checkpoint.Run, _ *modelLease) bool {
			return r.Status == checkpoint.StatusPending || r.Status == checkpoint.StatusRunning
		})
		if !ok {
			return
		}
		w.apply(checkpoint.Entry{Kind: checkpoint.KindCancel, Run: id, Actor: "op", Reason: "operator"})
	case 6: // a lease of an ended run is let go (its owner saw the end) or lapses
		id, ok := pick("let go", func(r *checkpoint.Run, l *modelLease) bool {
			return l != nil && l.ended.IsZero() && r.Status == checkpoint.StatusCancelled
		})
		if !ok {
			return
		}
		w.leases[id].ended = w.now
		w.inStep[id] = false // its owner stopped, in step b or not
		w.tick()
	case 7: // the watch catches up, as of some moment up to now
		back := rapid.IntRange(0, 3).Draw(t, "watch lag ms")
		if at := w.now.Add(-time.Duration(back) * time.Millisecond); at.After(w.asOf) {
			w.asOf = at
		}
		w.tick()
	case 8: // the leader's state applies what it wrote
		w.applyUnapplied()
	case 9: // a new leader
		w.newTerm()
	case 11: // a leader's last pass: it is replaced before its state applied its assigns
		w.pass()
		w.newTerm()
	case 10: // an operator retries a cancelled run: it is queued again, at its first
		// place (oldest submission first), and its retry may reach the log ahead of
		// assigns the leader wrote but its state has not applied
		id, ok := pick("retry", func(r *checkpoint.Run, _ *modelLease) bool { return r.Status == checkpoint.StatusCancelled })
		if !ok {
			return
		}
		w.applyNow(checkpoint.Entry{Kind: checkpoint.KindRetry, Run: id, Actor: "op"})
	}
}

// stepSlotted is one move of a paystep run's owner (the worker's runStep and park): it
// commits a; at b, with the slot in its state, it runs b (inStep) and then commits b and
// ends the run, letting go of its lease; without the slot it parks on the key and lets
// go of its lease (the leader's grant wakes the run for a new epoch).
func (w *keyWorld) stepSlotted(id string, r *checkpoint.Run) {
	v, err := w.s.View(id)
	if err != nil {
		w.t.Fatal(err)
	}
	aDone := false
	for _, st := range v.Steps {
		if st.Name == "a" && st.Status == checkpoint.StepSucceeded {
			aDone = true
		}
	}
	letGo := func() {
		w.inStep[id] = false
		w.leases[id].ended = w.now
		w.tick()
	}
	keys := []checkpoint.SlotKey{{Key: w.keyOf[id], Limit: keyLimit}}
	commit := func(step string) error {
		return w.apply(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: id, Epoch: r.Epoch, Owner: "w", Step: step, Item: checkpoint.ItemWhole, Output: json.RawMessage(`{}`)})[0]
	}
	switch {
	case !aDone:
		if commit("a") != nil {
			letGo()
		}
	case w.inStep[id]:
		if commit("b") != nil {
			letGo()
			return
		}
		w.apply(checkpoint.Entry{Kind: checkpoint.KindComplete, Run: id, Epoch: r.Epoch, Owner: "w", Status: checkpoint.StatusSucceeded})
		letGo()
	case r.HoldsSlots("b", keys):
		w.inStep[id] = true
	default:
		w.apply(checkpoint.Entry{Kind: checkpoint.KindPark, Run: id, Epoch: r.Epoch, Owner: "w", Step: "b", Item: checkpoint.ItemWhole,
			Wait: &checkpoint.Wait{Kind: checkpoint.WaitConcurrency, Keys: keys}})
		letGo()
	}
}

// keysProperty is the slots' invariant over random interleavings: at no moment do more
// runs of a key hold a lease (and so possibly run a step) than its limit, however the
// leader's passes, the workers' takes, the owners' ends, operators' cancels of runs
// whose owners hold on, and the watch's lag interleave.
func keysProperty(guards keyGuards, moves int) func(*rapid.T) {
	return func(rt *rapid.T) {
		w := newKeyWorld(rt, "state", guards)
		defer func() { _ = w.s.Close() }()
		for i := 0; i < moves; i++ {
			w.step(rt)
			for key, ids := range w.running() {
				if len(ids) > keyLimit {
					rt.Fatalf("key %s: runs %v hold leases at once (limit %d)", key, ids, keyLimit)
				}
			}
		}
	}
}

// interleavingMoves is how long an interleaving is: the damage of some guards (the
// term's catch-up, a step slot's drain) needs a dozen moves in a row, and at 80 moves a
// control found it in one interleaving of thousands, some runs not within 5,000 (red in
// a busy-machine CI run); at 200, within a few hundred.
const interleavingMoves = 200

// keysChecks is how many interleavings the property tries.
const keysChecks = "300"

func TestKeySlotsNeverExceedTheLimitInRealTime(t *testing.T) {
	setRapidFlag(t, "rapid.checks", keysChecks)
	t.Run("workflow keys", func(t *testing.T) { rapid.Check(t, keysProperty(keyGuards{}, interleavingMoves)) })
	t.Run("with step keys", func(t *testing.T) { rapid.Check(t, keysProperty(keyGuards{steps: true}, interleavingMoves)) })
}

// The controls switch off one guard each; the same property then finds two runs of a
// key on leases at once:
//   - the drain (a slot free once the state ends its run): a run started beside a
//     cancelled run whose owner still holds its lease;
//   - the leader's own unapplied assigns: a second pass, before the first pass's assign
//     is applied, admits beside it an older run of the key that a retry queued again
//     ahead of it;
//   - a new term's barrier: a new leader whose fresh watch has no lease yet misses a
//     cancelled run's (released before the term began) and starts the next run;
//   - a new term's catch-up (Hooks.NoTermTail): a new leader whose state has not
//     applied the last leader's final assign admits an older run of the key, queued
//     again by a retry, beside it;
//   - a step slot's drain (Hooks.NoStepDrain): a paystep run cancelled while its owner
//     runs step b gives its slot back at once, and another run of the key starts.
func TestKeySlotsControls(t *testing.T) {
	for _, c := range []struct {
		name   string
		guards keyGuards
	}{
		{"drain off", keyGuards{noDrain: true}},
		{"unapplied off", keyGuards{noUnapplied: true}},
		{"barrier off", keyGuards{noBarrier: true}},
		{"term tail off", keyGuards{noTermTail: true}},
		{"step drain off", keyGuards{noStepDrain: true, steps: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			setRapidFlag(t, "rapid.checks", "5000")
			setRapidFlag(t, "rapid.shrinktime", "2s")
			setRapidFlag(t, "rapid.nofailfile", "true")
			rec := failtb.New(t)
			rapid.Check(rec, keysProperty(c.guards, interleavingMoves))
			if !rec.Failed() {
				t.Fatalf("with the %s, no interleaving put two runs of a key on leases at once: the property cannot fail", c.name)
			}
			t.Logf("found: %s", strings.Join(rec.Msgs, "\n"))
		})
	}
}

func setRapidFlag(t *testing.T, name, value string) {
	old := flag.Lookup(name).Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}
