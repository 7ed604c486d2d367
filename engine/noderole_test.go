package engine

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/logstream"
)

// A node on the node role's permissions (client.PermissionsOf, as flowd --auth and
// `flowctl auth permissions node` give them) does all a flowd does: it creates the
// streams and buckets, leads, runs workflows, snapshots and compacts the log; a second
// node joins from the snapshot and leads when the first stops. The server refuses none
// of their publishes. (Deleting flow's streams is what the role may not do: natsnode
// TestNodeRoleCannotDeleteFlowsStreams.)
func TestNodeRoleDoesAllAFlowdDoes(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NoSync: true, Auth: true,
		Users: []natsnode.User{{Name: "nora", Password: "n-secret", Role: "node"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	var mu sync.Mutex
	var refused []error
	asNode := []nats.Option{nats.UserInfo("nora", "n-secret"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			mu.Lock()
			refused = append(refused, err)
			mu.Unlock()
		}
	})}
	a := startEngine(t, func(c *Config) {
		c.NATSURL, c.NATSOptions, c.SnapshotEvery = srv.ClientURL(), asNode, 15
	})
	apply(t, a, oneStepWorkflow)
	var ids []string
	for range 14 {
		v := runToEnd(t, a, "one", nil)
		if v.Run.Status != checkpoint.StatusSucceeded {
			t.Fatalf("a run on the node role: %+v", v.Run)
		}
		ids = append(ids, v.Run.ID)
	}
	ctx := ctxT(t, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := a.js.Stream(ctx, logstream.DefaultStream)
		if err != nil {
			t.Fatal(err)
		}
		snaps, _ := a.clog.Snapshots.List(ctx)
		if s.CachedInfo().State.FirstSeq > 1 && len(snaps) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot and compaction on the node role within 30s (first sequence %d, snapshots %v)", s.CachedInfo().State.FirstSeq, snaps)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream, with a deadline
	}
	b := startEngine(t, func(c *Config) {
		c.NodeID, c.NATSURL, c.NATSOptions = "node-b", srv.ClientURL(), asNode
	})
	for _, id := range ids {
		if r, err := b.store.Run(id); err != nil || r.Status != checkpoint.StatusSucceeded {
			t.Fatalf("the node that joined from the snapshot: run %s: %+v %v", id, r, err)
		}
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for !b.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the second node did not lead within 30s of the first one's stop")
		}
		time.Sleep(20 * time.Millisecond) // polling the election, with a deadline
	}
	if v := runToEnd(t, b, "one", nil); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("a run on the second leader: %+v", v.Run)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) > 0 {
		t.Fatalf("the server refused the node role %d publishes, the first: %v", len(refused), refused[0])
	}
}
