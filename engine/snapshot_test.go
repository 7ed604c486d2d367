package engine

import (
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
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
