package engine

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/internal/base/jsport"
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
	// Snapshot removal: more snapshots than are kept, so that the oldest is deleted
	// (nats.go's ObjectStore.Delete purges its chunks).
	first, err := a.Ops().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range logstream.KeepSnapshots {
		runToEnd(t, a, "one", nil)
		if _, err := a.Ops().Snapshot(ctx); err != nil {
			t.Fatalf("a snapshot on the node role: %v", err)
		}
	}
	snaps, err := a.clog.Snapshots.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		if s.Name == first.Name {
			t.Fatalf("snapshot %s was not removed on the node role (snapshots %v)", first.Name, snaps)
		}
	}
	// A changed --lease-ttl: the node may not update the buckets (issue 36), so it says
	// so (readyz) with the command that does, and an admin's repair sets it.
	lease := testLease
	lease.TTL = 2 * testLease.TTL
	b := startEngine(t, func(c *Config) {
		c.NodeID, c.NATSURL, c.NATSOptions, c.Lease = "node-b", srv.ClientURL(), asNode, lease
	})
	for _, id := range ids {
		if r, err := b.store.Run(id); err != nil || r.Status != checkpoint.StatusSucceeded {
			t.Fatalf("the node that joined from the snapshot: run %s: %+v %v", id, r, err)
		}
	}
	said := strings.Join(b.Health(ctx).Problems, "\n")
	for _, want := range []string{"KV_FLOW_LEASES: max age (TTL) 1s, flow wants 2s", "KV_FLOW_LEADER: max age (TTL) 1s, flow wants 2s", "flowctl cluster repair"} {
		if !strings.Contains(said, want) {
			t.Fatalf("node-b with another --lease-ttl: readyz says %q; want %q", said, want)
		}
	}
	if _, err := b.Ops().RepairStreams(ctx, false); !errors.Is(err, ErrNoAdminPath) {
		t.Fatalf("a repair on a node's credential: %v; want ErrNoAdminPath", err)
	}
	admin, err := srv.Connect() // the operator's admin credential, given once
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ajs, _ := jetstream.New(admin)
	if _, err := jsport.Repair(ctx, ajs, b.wantedStreams(), false, 0); err != nil {
		t.Fatal(err)
	}
	if f := b.streamFindings(ctx, true); len(f) != 0 {
		t.Fatalf("after the admin's repair node-b still finds %v", f)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for !b.isLeader() {
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
