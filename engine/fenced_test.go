package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/within"
	"github.com/flowrun/flow/steps"
)

// gates are steps that block until the test opens them, once per (node, step).
type gates struct {
	mu      sync.Mutex
	entered map[string]chan struct{}
	open    map[string]chan struct{}
	opened  map[string]bool
}

// newGates returns gates that are all opened when the test ends, so that engines
// whose steps wait on them can stop even if the test failed half way.
func newGates(t *testing.T) *gates {
	g := &gates{entered: map[string]chan struct{}{}, open: map[string]chan struct{}{}, opened: map[string]bool{}}
	t.Cleanup(func() {
		g.mu.Lock()
		keys := make([]string, 0, len(g.open))
		for k := range g.open {
			keys = append(keys, k)
		}
		g.mu.Unlock()
		for _, k := range keys {
			g.release(k)
		}
	})
	return g
}

// release opens a gate (once).
func (g *gates) release(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened[key] {
		g.opened[key] = true
		close(g.open[key])
	}
}

func (g *gates) pair(key string) (entered, open chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.entered[key] == nil {
		g.entered[key], g.open[key] = make(chan struct{}), make(chan struct{})
	}
	return g.entered[key], g.open[key]
}

// step blocks the first time node runs it (key node/step) until opened; it ignores its
// context, like a step that does not notice its lease is gone.
func (g *gates) step(node string, block map[string]bool) steps.Step {
	var once sync.Map
	return steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
		key := node + "/" + in.Step
		if _, seen := once.LoadOrStore(key, true); !seen && block[in.Step] {
			entered, open := g.pair(key)
			close(entered)
			select { // every gate is opened by the test, or at its end
			case <-open:
			case <-time.After(2 * time.Minute):
				return nil, fmt.Errorf("gate %s never opened", key)
			}
		}
		return json.RawMessage(`{"by":"` + node + `"}`), nil
	})
}

const fencedWorkflow = `
name: fenced
steps:
  - name: s1
    uses: gate
  - name: s2
    needs: [s1]
    uses: gate
  - name: s3
    needs: [s2]
    uses: gate
`

// runStolen: node-a starts the run, stalls in s2 with its heartbeat removed (its lease
// lapses but it does not notice); node-b takes over and stalls in bBlocks; then node-a
// wakes and commits s2 with its old epoch. With bBlocks "s2", nobody has committed s2
// when the zombie does, so only the epoch check can fence it; with "s3", node-b has
// checkpointed s2 first, and either check can.
func runStolen(t *testing.T, guardsOff storeGuardsOff, bBlocks string) (a *Engine, v *checkpoint.RunView) {
	g := newGates(t)
	zombie := guardsOff.hooks()
	zombie.NoRenew, zombie.NoKillSwitch = true, true // node-a's worker has no heartbeat
	a = startEngineWith(t, zombie, func(c *Config) {
		c.NATSListen = "127.0.0.1:0"
		c.Workers = 1
		c.Registry = steps.NewRegistry(0)
		_ = c.Registry.Register("gate", g.step("node-a", map[string]bool{"s2": true}))
	})
	apply(t, a, fencedWorkflow)
	ctx := ctxT(t, 60*time.Second)
	id, err := a.StartRun(ctx, "fenced", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	aIn, _ := g.pair("node-a/s2")
	within.Recv(t, 30*time.Second, aIn, "node-a entering s2")
	b := startEngineWith(t, guardsOff.hooks(), func(c *Config) {
		c.NodeID = "node-b"
		c.NATSURL = a.ClientURL()
		c.Registry = steps.NewRegistry(0)
		_ = c.Registry.Register("gate", g.step("node-b", map[string]bool{bBlocks: true}))
	})
	bIn, _ := g.pair("node-b/" + bBlocks)
	select {
	case <-bIn:
	case <-ctx.Done():
		t.Fatal("node-b never took the run over")
	}
	g.release("node-a/s2") // the zombie wakes and commits s2 with its old epoch
	// Wait on what the log decided of the zombie's commit (fenced, or with a guard off
	// accepted): the state is what the log's notifications tell about.
	if err := a.waitFor(ctx, func() bool {
		v, _ := a.store.View(id)
		_, decided := zombieCommit(v)
		return decided
	}); err != nil {
		t.Fatal("the zombie's commit never reached the log")
	}
	g.release("node-b/" + bBlocks)
	if _, err := b.WaitRun(ctx, id); err != nil {
		t.Fatal(err)
	}
	v, err = b.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	return a, v
}

// zombieCommit is node-a's commit of s2 in its first epoch, once the log decided it.
func zombieCommit(v *checkpoint.RunView) (checkpoint.Event, bool) {
	if v == nil || len(v.Run.Epochs) == 0 {
		return checkpoint.Event{}, false
	}
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindCommit && ev.Step == "s2" && ev.Owner == "node-a" && ev.Epoch == v.Run.Epochs[0].Epoch {
			return ev, true
		}
	}
	return checkpoint.Event{}, false
}

func countAccepted(v *checkpoint.RunView, step string) int {
	if v == nil {
		return 0
	}
	n := 0
	for _, ev := range v.Events {
		if ev.Kind == checkpoint.KindCommit && ev.Step == step && ev.Item == checkpoint.ItemWhole && ev.Outcome == "accepted" {
			n++
		}
	}
	return n
}

// The epoch check: the zombie commits s2, which nobody else has committed yet (node-b
// holds the new epoch and waits in s2), so the checkpoint check has nothing to fence
// it with. It is fenced as stale-epoch, node-a stops, and node-b's s2 is the one kept.
func TestFencedStop(t *testing.T) {
	a, v := runStolen(t, storeGuardsOff{}, "s2")
	// node-a stops right after its fenced commit's outcome reaches it.
	deadline := time.Now().Add(5 * time.Second)
	for a.workers.Stats().Stolen.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("node-a stopped %d epochs as %s, want 1", a.workers.Stats().Stolen.Load(), ReasonStolen)
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, with a deadline
	}
	if v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run %s: %s", v.Run.Status, v.Run.Error)
	}
	if len(v.Fenced) != 1 || v.Fenced[0].Owner != "node-a" || v.Fenced[0].Step != "s2" ||
		v.Fenced[0].Epoch >= v.Fenced[0].CurrentEpoch || v.Fenced[0].Reason != "stale-epoch" {
		t.Fatalf("fenced = %+v; want node-a's s2 fenced as stale-epoch", v.Fenced)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if n := countAccepted(v, s); n != 1 {
			t.Fatalf("step %s accepted %d times", s, n)
		}
	}
	last := v.Run.Epochs[len(v.Run.Epochs)-1]
	// Lease-expired if the leader saw the lapse; reconciled if leadership moved meanwhile
	// and the new leader found the run without a live lease. Both count.
	reclaimed := last.Reason == checkpoint.ReasonLeaseExpired || last.Reason == checkpoint.ReasonReconciled
	if last.Owner != "node-b" || !reclaimed || v.Run.EpochChanges != 1 {
		t.Fatalf("epochs %+v", v.Run.Epochs)
	}
	if out := v.Steps[1].Output; string(out) != `{"by":"node-b"}` {
		t.Fatalf("s2's checkpoint is %s; want node-b's", out)
	}
}

// The epoch check's negative control: with it off alone, the zombie's commit of s2
// (nobody else's yet) is accepted with its stale epoch, and the run keeps the zombie's
// output; node-b's own s2 is then fenced by the checkpoint check.
func TestFencedStopWithoutTheEpochCheck(t *testing.T) {
	_, v := runStolen(t, storeGuardsOff{epoch: true}, "s2")
	ev, _ := zombieCommit(v)
	if ev.Outcome != "accepted" {
		t.Fatalf("without the epoch check the zombie's commit was %q; the control expects it accepted", ev.Outcome)
	}
	if out := v.Steps[1].Output; string(out) != `{"by":"node-a"}` {
		t.Fatalf("s2's checkpoint is %s; the control expects the zombie's", out)
	}
}

// The checkpoint check: with the epoch check off, a zombie's commit of a step the new
// owner has already checkpointed is fenced as checkpoint-exists.
func TestCheckpointCheckFencesAZombieOnACommittedStep(t *testing.T) {
	_, v := runStolen(t, storeGuardsOff{epoch: true}, "s3")
	ev, _ := zombieCommit(v)
	if ev.Outcome == "accepted" || len(v.Fenced) != 1 || v.Fenced[0].Reason != "checkpoint-exists" {
		t.Fatalf("zombie's commit %q, fenced %+v; want it fenced as checkpoint-exists", ev.Outcome, v.Fenced)
	}
	if n := countAccepted(v, "s2"); n != 1 {
		t.Fatalf("s2 accepted %d times", n)
	}
}

// The checkpoint check's negative control: with both checks off, the zombie's stale
// commit of s2 is accepted beside node-b's: the double commit fencing exists to prevent.
func TestFencedStopNegativeControl(t *testing.T) {
	_, v := runStolen(t, storeGuardsOff{epoch: true, checkpoint: true}, "s3")
	if n := countAccepted(v, "s2"); n != 2 {
		t.Fatalf("without fencing s2 was accepted %d times; the control expects the double commit", n)
	}
}

// The drill behind `flowctl drill zombie`: a worker paused past its lease wakes and
// commits without its local check; the log fences it and the run ends on the new epoch.
func TestDrillZombie(t *testing.T) {
	e := startEngine(t, nil)
	v, err := e.Ops().DrillZombie(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r := v.Run.Epochs; v.Run.Status != checkpoint.StatusSucceeded || len(r) < 2 ||
		(r[1].Reason != checkpoint.ReasonLeaseExpired && r[1].Reason != checkpoint.ReasonReconciled) {
		t.Fatalf("run %s epochs %+v", v.Run.Status, v.Run.Epochs)
	}
	// The paused worker's commit carries the first epoch: whatever the new owner did
	// meanwhile, the epoch check (which comes first) is what fences it.
	if len(v.Fenced) != 1 || v.Fenced[0].Step != "pause" || v.Fenced[0].Epoch != v.Run.Epochs[0].Epoch || v.Fenced[0].Reason != "stale-epoch" {
		t.Fatalf("fenced %+v", v.Fenced)
	}
	// The paused worker stops right after its fenced commit's outcome reaches it.
	deadline := time.Now().Add(5 * time.Second)
	for e.workers.Stats().Stolen.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("stolen %d, want 1", e.workers.Stats().Stolen.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling a counter, with a deadline
	}
	for _, s := range []string{"before", "pause", "after"} {
		if countAccepted(v, s) != 1 {
			t.Fatalf("step %s accepted %d times", s, countAccepted(v, s))
		}
	}
}

// Lock delay: the leader waits after a lease lapsed before it gives the run a new epoch.
func TestLockDelay(t *testing.T) {
	g := newGates(t)
	const delay = 1500 * time.Millisecond
	a := startEngineWith(t, &testhooks.Hooks{NoRenew: true, NoKillSwitch: true}, func(c *Config) {
		c.Workers = 1
		c.LockDelay = delay
		c.ReconcileInterval = 100 * time.Millisecond
		c.Registry = steps.NewRegistry(0)
		_ = c.Registry.Register("gate", g.step("node-a", map[string]bool{"s2": true}))
	})
	apply(t, a, fencedWorkflow)
	ctx := ctxT(t, 30*time.Second)
	id, err := a.StartRun(ctx, "fenced", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.waitFor(ctx, func() bool { r, _ := a.store.Run(id); return len(r.Epochs) >= 2 }); err != nil {
		t.Fatal(err)
	}
	r, _ := a.store.Run(id)
	gap := r.Epochs[1].At.Sub(r.Epochs[0].At)
	if gap < testLease.TTL+delay {
		t.Fatalf("new epoch %s after the first; want at least TTL + lock delay (%s)", gap, testLease.TTL+delay)
	}
	g.release("node-a/s2")
}

// storeGuardsOff names the state machine's guards a test turns off on both nodes.
type storeGuardsOff struct{ epoch, checkpoint bool }

func (g storeGuardsOff) hooks() *testhooks.Hooks {
	return &testhooks.Hooks{NoEpochCheck: g.epoch, NoCheckpointCheck: g.checkpoint}
}
