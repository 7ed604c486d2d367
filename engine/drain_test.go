package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/testkit/within"
	"github.com/flowrun/flow/steps"
)

// Drain: a node that stops (SIGTERM in flowd) hands its running run back: a requeue
// entry and a released lease, so another node resumes it at once with a new epoch that
// does not count toward max_epochs. Each step records its side effect (node, epoch) in
// the test, outside the store: the checkpointed first step does not run again, the step
// in flight at the drain runs once in each epoch, no write is fenced and no epoch change
// is counted.
func TestStopHandsRunsBack(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	var mu sync.Mutex
	var effects []effect
	// mark records its side effect, then holds for `hold` (the drain lands there).
	registry := func() *steps.Registry {
		reg := steps.NewRegistry(0)
		_ = reg.Register("mark", steps.Func(func(ctx context.Context, in steps.Input) (json.RawMessage, error) {
			mu.Lock()
			effects = append(effects, effect{Run: in.Run, Step: in.Step, Item: in.Item, Epoch: in.Epoch, Line: len(effects)})
			mu.Unlock()
			if hold, _ := time.ParseDuration(fmt.Sprint(in.With["hold"])); hold > 0 {
				tm := time.NewTimer(hold)
				defer tm.Stop()
				select {
				case <-tm.C:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return json.RawMessage(`{}`), nil
		}))
		return reg
	}
	// A lease TTL of 6 s: resuming "at once" (the held step again, 1.5 s) and after the
	// lease lapses (at least 2/3 TTL after the stop) are seconds apart, which a loaded
	// machine under -race keeps apart.
	lease := testLease
	lease.TTL = 6 * time.Second
	a := startEngine(t, func(c *Config) { c.NATSURL = srv.ClientURL(); c.Registry = registry(); c.Lease = lease })
	apply(t, a, `
name: long
steps:
  - name: first
    uses: mark
  - name: wait
    needs: [first]
    uses: mark
    with: {hold: 1500ms}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := a.StartRun(ctx, "long", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.waitFor(ctx, func() bool {
		steps, _ := a.store.Steps(id)
		return len(steps) == 2 && steps[1].Status == checkpoint.StepRunning
	}); err != nil {
		t.Fatal(err)
	}
	b := startEngine(t, func(c *Config) {
		c.NodeID = "node-b"
		c.NATSURL = srv.ClientURL()
		c.Registry = registry()
		c.Lease = lease
	})
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := a.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if a.workers.Stats().HandedBack.Load() != 1 {
		t.Fatalf("handed back %d runs", a.workers.Stats().HandedBack.Load())
	}
	r, err := b.WaitRun(ctx, id)
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, r)
	}
	// Two epochs, the second begun by the hand-back, which does not count.
	if len(r.Epochs) != 2 || r.Epochs[0].Reason != checkpoint.ReasonAssigned || r.Epochs[1].Owner != "node-b" ||
		r.Epochs[1].Reason != checkpoint.ReasonReleased || r.EpochChanges != 0 {
		t.Fatalf("epochs %+v changes %d", r.Epochs, r.EpochChanges)
	}
	// Resumed at once, not after the lease lapsed: the held step again, and less than
	// the 2/3 TTL a lapse takes at least.
	if took := time.Since(start); took > 1500*time.Millisecond+lease.TTL/2 {
		t.Fatalf("resumed %s after the stop; want the held step's 1.5 s and well under the lease's lapse (2/3 of %s)", took, lease.TTL)
	}
	v, err := b.Run(id)
	if err != nil {
		t.Fatal(err)
	}
	drained := r.Epochs[0].Epoch
	mu.Lock()
	got := slices.Clone(effects)
	mu.Unlock()
	// first, checkpointed in the drained epoch, never runs again; wait, in flight at the
	// drain, runs there and once in the next epoch; nothing is fenced (the drained node
	// wrote nothing after its requeue).
	repeats := checkResumed(t, v, got, func(e effect) bool { return e.Step == "wait" && e.Epoch == drained })
	checkNoFenced(t, v)
	if cp := acceptedEpochs(t, v); cp[stepItem{"first", checkpoint.ItemWhole}] != drained || repeats != 1 {
		t.Errorf("first checkpointed in epoch %d, want the drained epoch %d; %d repeated side effects, want 1 (wait's): %+v",
			cp[stepItem{"first", checkpoint.ItemWhole}], drained, repeats, got)
	}
}

// A drain under load leaves nothing running: every run this node had claimed, including
// the ones the leader assigned to itself while Stop began (their assign still in flight),
// is handed back. The state is read from the node's own store after Stop.
func TestStopUnderLoadLeavesNothingRunning(t *testing.T) {
	for round := 0; round < 5; round++ {
		var dir string
		e := startEngine(t, func(c *Config) { c.Workers = 64; dir = c.DataDir })
		waitLeader(t, e)
		apply(t, e, "name: busy\nsteps:\n  - name: a\n    uses: sleep\n    with: {duration: 50ms}\n")
		ctx := ctxT(t, 30*time.Second)
		var started atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if _, err := e.StartRun(ctx, "busy", nil, RunOptions{}); err != nil {
						return // the node is stopping
					}
					started.Add(1)
				}
			}()
		}
		for started.Load() < 40 {
			if err := e.waitFor(ctx, func() bool { return started.Load() >= 40 }); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		within.Group(t, 30*time.Second, &wg, "the submitters after the stop")
		s, err := checkpoint.OpenStore(filepath.Join(dir, "state"), checkpoint.StoreOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n, err := s.CountRuns(checkpoint.StatusRunning)
		s.Close()
		if err != nil || n != 0 {
			t.Fatalf("round %d: %d runs left running after the drain (%v)", round, n, err)
		}
	}
}
