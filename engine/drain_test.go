package engine

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/natsnode"
)

// Drain: a node that stops (SIGTERM in flowd) hands its running run back: a requeue
// entry and a released lease, so another node resumes it at once with a new epoch that
// does not count toward max_epochs.
func TestStopHandsRunsBack(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	a := startEngine(t, func(c *Config) { c.NATSURL = srv.ClientURL() })
	apply(t, a, `
name: long
steps:
  - name: first
    uses: noop
  - name: wait
    needs: [first]
    uses: sleep
    with: {duration: 1500ms}
`)
	ctx := ctxT(t, 30*time.Second)
	id, err := a.StartRun(ctx, "long", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, a.clog, func() bool {
		steps, _ := a.store.Steps(id)
		return len(steps) == 2 && steps[1].Status == checkpoint.StepRunning
	}); err != nil {
		t.Fatal(err)
	}
	b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = srv.ClientURL() })
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := a.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	if a.Stats().HandedBack.Load() != 1 {
		t.Fatalf("handed back %d runs", a.Stats().HandedBack.Load())
	}
	r, err := b.WaitRun(ctx, id)
	if err != nil || r.Status != checkpoint.StatusSucceeded {
		t.Fatalf("%v %+v", err, r)
	}
	last := r.Epochs[len(r.Epochs)-1]
	if last.Owner != "node-b" || last.Reason != checkpoint.ReasonReleased || r.EpochChanges != 0 {
		t.Fatalf("epochs %+v changes %d", r.Epochs, r.EpochChanges)
	}
	// Resumed at once, not after a lease TTL: the first step was not run again.
	v, _ := b.Run(id)
	if countAccepted(v, "first") != 1 || time.Since(start) > 1500*time.Millisecond+testLease.TTL {
		t.Fatalf("took %s; first accepted %d times", time.Since(start), countAccepted(v, "first"))
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
			if err := waitFor(ctx, e.clog, func() bool { return started.Load() >= 40 }); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
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
