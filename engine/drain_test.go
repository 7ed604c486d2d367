package engine

import (
	"context"
	"path/filepath"
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
