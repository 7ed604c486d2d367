package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/logstream"
)

// The leader snapshots the state every SnapshotEvery messages and compacts the log
// below it (never past what a live node applied); a node with an empty data dir joins
// from the newest snapshot and the log after it, with every run the others know.
// Control: the same join without the snapshot (deleted) is refused: the log alone no
// longer holds the beginning.
func TestSnapshotCompactionAndJoin(t *testing.T) {
	a := startEngine(t, func(c *Config) {
		c.NATSListen = "127.0.0.1:0"
		c.SnapshotEvery = 15
	})
	apply(t, a, oneStepWorkflow)
	var ids []string
	for i := range 12 {
		v := runToEnd(t, a, "one", nil)
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("run %d: %+v", i, v.Run)
		}
		ids = append(ids, v.Run.ID)
	}
	ctx := ctxT(t, 60*time.Second)
	// Snapshots and compaction come after the messages that trigger them.
	deadline := time.Now().Add(30 * time.Second)
	var first uint64
	for {
		s, err := a.js.Stream(ctx, logstream.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		snaps, _ := a.clog.Snapshots.List(ctx)
		if first = s.CachedInfo().State.FirstSeq; first > 1 && len(snaps) > 0 {
			if newest := snaps[len(snaps)-1].Seq; first > newest+1 {
				t.Fatalf("the log was purged to %d, past the newest snapshot at %d", first, newest)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no compaction within 30s (first sequence %d, snapshots %v)", first, snaps)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream, with a deadline
	}
	if snaps, _ := a.clog.Snapshots.List(ctx); len(snaps) > logstream.KeepSnapshots {
		t.Fatalf("%d snapshots kept, want at most %d", len(snaps), logstream.KeepSnapshots)
	}
	b := startEngine(t, func(c *Config) {
		c.NodeID = "node-b"
		c.NATSURL = a.ClientURL()
		c.DisableScheduler = true
	})
	for _, id := range ids {
		r, err := b.store.Run(id)
		if err != nil || r.Status != checkpoint.StatusSucceeded {
			t.Fatalf("the joined node's run %s: %+v %v", id, r, err)
		}
	}
	if _, err := b.Workflow("one", 0); err != nil {
		t.Fatalf("the joined node has no workflow: %v", err)
	}
	// Control: without the snapshots, a new node cannot start from the compacted log.
	obs, err := a.js.ObjectStore(ctx, logstream.SnapshotBucket)
	if err != nil {
		t.Fatal(err)
	}
	snaps, _ := a.clog.Snapshots.List(ctx)
	for _, s := range snaps {
		if err := obs.Delete(ctx, s.Name); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{NodeID: "node-c", DataDir: t.TempDir(), NATSURL: a.ClientURL(), Lease: testLease, DisableScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err == nil {
		_ = c.Stop(ctx)
		t.Fatalf("control: a new node started from a log compacted to %d without a snapshot", first)
	}
}

// A live node that lags behind the log while the leader snapshots and compacts (here
// its applier is held: its report stays at the sequence it applied) keeps what it needs:
// the leader purges the log up to the node's report and no further, though a newer
// snapshot would allow it; released, the node catches up from the log, without
// restoring a snapshot. Control (Hooks.CompactPastLive on the leader: compaction ignores
// the reports): the log is purged past the lagging node's report, its applier stops
// (ErrWrongLog), and it starts again only by restoring the snapshot (its state moved
// aside).
func TestCompactionKeepsWhatALaggingNodeNeeds(t *testing.T) {
	for _, guard := range []bool{true, false} {
		t.Run(map[bool]string{true: "keeps-what-it-needs", false: "control-compact-past-live"}[guard], func(t *testing.T) {
			ha := new(testhooks.Hooks)
			ha.CompactPastLive.Store(!guard)
			a := startEngineWith(t, ha, func(c *Config) {
				c.NATSListen = "127.0.0.1:0"
				c.SnapshotEvery = 10
			})
			apply(t, a, oneStepWorkflow)
			dirB := filepath.Join(t.TempDir(), "b")
			hb := new(testhooks.Hooks)
			startB := func() *Engine {
				return startEngineWith(t, hb, func(c *Config) {
					c.NodeID, c.DataDir, c.NATSURL, c.DisableScheduler = "node-b", dirB, a.ClientURL(), true
				})
			}
			// node-b joins before the log is compacted (a join during a compaction can be
			// refused: see the report of issue 30), and applies some runs.
			b := startB()
			var ids []string
			for range 5 {
				ids = append(ids, runToEnd(t, a, "one", nil).Run.ID)
			}
			ctx := ctxT(t, 90*time.Second)
			if err := b.clog.Applier.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			// node-b lags: it applies nothing more, and its report says where it stopped.
			hb.HoldApply.Store(true)
			var report uint64
			deadline := time.Now().Add(3 * nodes.ReportEvery)
			for {
				low, any, err := nodes.LiveApplied(ctx, a.ports.Nodes, "node-a")
				if err == nil && any && low == b.store.Applied() {
					report = low
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("node-b's report %d (%v, %v) never reached its applied %d", low, any, err, b.store.Applied())
				}
				time.Sleep(50 * time.Millisecond) // polling the reports, with a deadline
			}
			// The log moves on (workflows only: no run for node-b to take), past a snapshot.
			const written = 25
			for i := range written {
				apply(t, a, fmt.Sprintf("name: lag-%d\nsteps:\n  - name: a\n    uses: noop\n", i))
			}
			var first, snapSeq uint64
			deadline = time.Now().Add(30 * time.Second) // a compaction follows each snapshot, and comes every 5 s
			for {
				s, err := a.js.Stream(ctx, logstream.DefaultStream)
				if err != nil {
					t.Fatal(err)
				}
				first = s.CachedInfo().State.FirstSeq
				if snaps, _ := a.clog.Snapshots.List(ctx); len(snaps) > 0 {
					snapSeq = snaps[len(snaps)-1].Seq
				}
				if guard && first > report+1 {
					t.Fatalf("the log was purged to %d, past node-b's report %d", first, report)
				}
				if snapSeq > report && ((guard && first == report+1) || (!guard && first > report+1)) {
					break
				}
				if time.Now().After(deadline) {
					if !guard {
						t.Fatalf("control: the log was not purged past node-b's report %d within 30s (first sequence %d, newest snapshot %d): the control shows nothing", report, first, snapSeq)
					}
					t.Fatalf("no compaction to node-b's report %d within 30s (first sequence %d, newest snapshot %d)", report, first, snapSeq)
				}
				time.Sleep(50 * time.Millisecond) // polling the stream, with a deadline
			}
			t.Logf("node-b applied %d; the newest snapshot is at %d, the log starts at %d", report, snapSeq, first)
			hb.HoldApply.Store(false)
			if !guard {
				select {
				case <-b.clog.Applier.Failed():
				case <-ctx.Done():
					t.Fatalf("control: node-b goes on (applied %d) though the log starts at %d, past its report %d: the control shows nothing", b.store.Applied(), first, report)
				}
				if err := b.clog.Applier.Err(); !errors.Is(err, logstream.ErrWrongLog) {
					t.Fatalf("control: node-b's applier stopped with %v; want ErrWrongLog", err)
				}
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_ = b.Stop(sctx)
				cancel()
				b = startB() // it must restore the snapshot to start again
			}
			if err := b.clog.Applier.CatchUp(ctx); err != nil {
				t.Fatalf("node-b after the lag: %v (applied %d)", err, b.store.Applied())
			}
			for i := range written {
				if _, err := b.Workflow(fmt.Sprintf("lag-%d", i), 0); err != nil {
					t.Fatalf("node-b after the lag: %v", err)
				}
			}
			for _, id := range ids {
				if r, err := b.store.Run(id); err != nil || r.Status != checkpoint.StatusSucceeded {
					t.Fatalf("node-b after the lag: run %s %+v %v", id, r, err)
				}
			}
			aside, _ := filepath.Glob(filepath.Join(dirB, "state.replaced-*"))
			switch {
			case guard && (len(aside) != 0 || b.clog.Applier.Err() != nil):
				t.Fatalf("node-b caught up by a restore (%v) or stopped (%v); want it caught up from the log", aside, b.clog.Applier.Err())
			case !guard && len(aside) != 1:
				t.Fatalf("control: node-b started again with its state moved aside %v; want one restore", aside)
			}
		})
	}
}
