package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/testhooks"
)

// A leader whose applier stopped (here an injected storage failure) leaves the
// election: the other node leads and a run started after the failure succeeds. Control
// (NoSitOut): the stopped node goes on leading from a state that no longer follows the
// log, and the run is never assigned: the cluster stopped scheduling while its leader
// renewed its term (before issue 14, what a dead applier did).
func TestStoppedApplierLeavesTheElection(t *testing.T) {
	for _, sitOut := range []bool{true, false} {
		t.Run(map[bool]string{true: "sit-out", false: "no-sit-out"}[sitOut], func(t *testing.T) {
			ha := new(testhooks.Hooks)
			ha.NoSitOut.Store(!sitOut)
			a := startEngineWith(t, ha, func(c *Config) { c.NATSListen = "127.0.0.1:0" })
			waitLeading(t, a, 0, 20*time.Second)
			b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = a.ClientURL() })
			apply(t, b, oneStepWorkflow)
			if err := a.clog.Applier.WaitApplied(ctxT(t, 10*time.Second), b.store.Applied()); err != nil {
				t.Fatal(err)
			}
			ha.FailApply.Store(true)
			id, err := b.StartRun(ctxT(t, 10*time.Second), "one", nil, RunOptions{ID: "after"})
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(waitErr(t, a), checkpoint.ErrStorage) {
				t.Fatalf("node-a's applier: %v", a.clog.Applier.Err())
			}
			if sitOut {
				r, err := b.WaitRun(ctxT(t, 30*time.Second), id)
				if err != nil || r.Status != checkpoint.StatusSucceeded {
					t.Fatalf("run after node-a's applier stopped: %v %+v", err, r)
				}
				if a.isLeader() || !b.isLeader() {
					t.Fatalf("leading: node-a %v, node-b %v", a.isLeader(), b.isLeader())
				}
				return
			}
			// Three lease TTLs: in the sit-out case node-b leads and the run succeeds within one.
			ctx, cancel := context.WithTimeout(context.Background(), 3*testLease.TTL)
			defer cancel()
			if r, err := b.WaitRun(ctx, id); err == nil {
				t.Fatalf("control: the run ended (%s) with the stopped node leading: the test shows nothing", r.Status)
			}
			if !a.isLeader() {
				t.Fatal("control: node-a stopped leading although NoSitOut was on")
			}
		})
	}
}

// waitErr waits until e's applier has stopped and returns why.
func waitErr(t *testing.T, e *Engine) error {
	t.Helper()
	select {
	case <-e.clog.Applier.Failed():
		return e.clog.Applier.Err()
	case <-ctxT(t, 20*time.Second).Done():
		t.Fatal("node-a's applier did not stop")
		return nil
	}
}
