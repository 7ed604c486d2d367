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
	"github.com/flowrun/flow/internal/testkit/failtb"
	"github.com/flowrun/flow/workflow"
)

// keyWorld is a model of what the leader cannot see directly: the real leases (a run
// can run a step only while its owner holds one, from before its claim until it is
// released or lapses) and a lease watch that lags behind them. The leader's side is the
// real thing: a checkpoint store the entries are applied to, PlanAssign and one
// slotCounter for the term.
type keyWorld struct {
	t       *rapid.T
	s       *checkpoint.Store
	specs   *specs.Cache
	slots   *slotCounter
	cursor  uint64
	noDrain bool
	now     time.Time
	asOf    time.Time // the watch is caught up as of this
	// leases: run -> when its lease was written and (zero: not yet) when it ended.
	leases map[string]*modelLease
	keyOf  map[string]string
	runs   []string
}

type modelLease struct{ made, ended time.Time }

const keyLimit = 1

func newKeyWorld(t *rapid.T, dir string, noDrain bool) *keyWorld {
	s, err := checkpoint.OpenStore(dir, checkpoint.StoreOptions{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	w := &keyWorld{t: t, s: s, specs: specs.New(s), slots: newSlotCounter(t0.Add(-time.Hour)), noDrain: noDrain, now: t0,
		asOf: t0.Add(-time.Millisecond), leases: map[string]*modelLease{}, keyOf: map[string]string{}}
	wf, err := workflow.Load("wf.yaml", []byte(fmt.Sprintf("name: pay\nconcurrency: {key: \"{{ inputs.acct }}\", limit: %d}\nsteps:\n  - {name: a, uses: noop}\n", keyLimit)), func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(wf)
	_ = w.apply(checkpoint.Entry{Kind: checkpoint.KindWorkflow, Owner: "api", Workflow: &checkpoint.WorkflowDef{Name: wf.Name, Digest: wf.Digest, Spec: spec}})
	return w
}

func (w *keyWorld) tick() { w.now = w.now.Add(time.Millisecond) }

// apply writes entries as one message; it returns each one's verdict.
func (w *keyWorld) apply(es ...checkpoint.Entry) []error {
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

// pass is one leader pass: count, plan, write the assigns (applied at once).
func (w *keyWorld) pass() {
	slots := func() (KeyCounts, bool) {
		released, next, complete := w.s.Released(w.cursor)
		w.cursor = next
		return w.slots.Count(SlotView{Holders: w.s.KeyHolders(nil), Released: released, ReleasedComplete: complete, Live: w.live(),
			AsOf: w.asOf, Now: w.now, NoDrain: w.noDrain}, func(id string) []workflow.KeyLimit { return RunKeys(w.specs, w.run(id)) })
	}
	plan, err := PlanAssign(w.s, w.specs, 4, slots, w.slots.admitted)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, r := range plan {
		w.apply(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: r.ID, Epoch: r.Epoch, Term: 1, Owner: "leader"})
	}
}

// running are the runs whose owner may be running a step now: their lease is held.
func (w *keyWorld) running() map[string][]string {
	byKey := map[string][]string{}
	for _, id := range w.runs {
		if l := w.leases[id]; l != nil && l.ended.IsZero() {
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
	switch rapid.IntRange(0, 7).Draw(t, "event") {
	case 0: // a run is started
		if len(w.runs) >= 12 {
			return
		}
		id := fmt.Sprintf("r%d", len(w.runs))
		acct := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "acct")
		in, _ := json.Marshal(map[string]string{"acct": acct})
		if err := w.apply(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: id, Owner: "api",
			Submit: &checkpoint.Submit{Workflow: "pay", Version: 1, Trigger: checkpoint.TriggerManual, Inputs: in, Steps: []checkpoint.StepSpec{{Name: "a"}}}})[0]; err != nil {
			t.Fatalf("submit %s: %v", id, err)
		}
		w.runs = append(w.runs, id)
		w.keyOf[id] = acct
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
		}
	case 4: // the owner finishes its run, and lets go of its lease
		id, ok := pick("finish", func(r *checkpoint.Run, l *modelLease) bool {
			return r.Status == checkpoint.StatusRunning && l != nil && l.ended.IsZero()
		})
		if !ok {
			return
		}
		r := w.run(id)
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
		w.tick()
	case 7: // the watch catches up, as of some moment up to now
		back := rapid.IntRange(0, 3).Draw(t, "watch lag ms")
		if at := w.now.Add(-time.Duration(back) * time.Millisecond); at.After(w.asOf) {
			w.asOf = at
		}
		w.tick()
	}
}

// keysProperty is the slots' invariant over random interleavings: at no moment do more
// runs of a key hold a lease (and so possibly run a step) than its limit, however the
// leader's passes, the workers' takes, the owners' ends, operators' cancels of runs
// whose owners hold on, and the watch's lag interleave.
func keysProperty(noDrain bool) func(*rapid.T) {
	return func(rt *rapid.T) {
		w := newKeyWorld(rt, "state", noDrain)
		defer func() { _ = w.s.Close() }()
		for i := 0; i < 80; i++ {
			w.step(rt)
			for key, ids := range w.running() {
				if len(ids) > keyLimit {
					rt.Fatalf("key %s: runs %v hold leases at once (limit %d)", key, ids, keyLimit)
				}
			}
		}
	}
}

// keysChecks is how many interleavings the property and its control each try.
const keysChecks = "300"

func TestKeySlotsNeverExceedTheLimitInRealTime(t *testing.T) {
	setRapidFlag(t, "rapid.checks", keysChecks)
	rapid.Check(t, keysProperty(false))
}

// The control: with the drain off (a slot free once the state ends its run), the same
// property finds a run started beside a cancelled run whose owner still holds its lease.
func TestKeySlotsControlDrainOff(t *testing.T) {
	setRapidFlag(t, "rapid.checks", keysChecks)
	setRapidFlag(t, "rapid.shrinktime", "2s")
	setRapidFlag(t, "rapid.nofailfile", "true")
	rec := failtb.New(t)
	rapid.Check(rec, keysProperty(true))
	if !rec.Failed() {
		t.Fatal("with the drain off, no interleaving put two runs of a key on leases at once: the property cannot fail")
	}
	t.Logf("found: %s", strings.SplitN(strings.Join(rec.Msgs, "\n"), "\n", 2)[0])
}

func setRapidFlag(t *testing.T, name, value string) {
	old := flag.Lookup(name).Value.String()
	if err := flag.Set(name, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set(name, old) })
}
