package engine

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/internal/base/port"
)

// seal seals one of flow's streams, as a node's credential could before issue 36.
func seal(t *testing.T, ctx context.Context, js jetstream.JetStream, name string) {
	t.Helper()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.Sealed = true
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("seal %s: %v", name, err)
	}
}

// A node facing sealed buckets and a sealed tasks stream (issue 36) says, in readyz,
// which and the command that mends them; the repair (cluster repair's engine side, on
// the embedded server's admin path) makes them anew, and the node leads again with a
// term above every term before, becomes ready, and runs a workflow; the log it refuses
// (FLOW_LOG cannot be recreated without losing every run) stays sealed and said.
func TestSealedBucketsAreSaidAndRepaired(t *testing.T) {
	e := startEngine(t, nil)
	apply(t, e, oneStepWorkflow)
	if v := runToEnd(t, e, "one", nil); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("before: %+v", v.Run)
	}
	ctx := ctxT(t, 60*time.Second)
	before := e.Metrics(ctx).HighestTerm
	for _, name := range []string{"KV_" + epoch.LeaderBucket, "KV_" + epoch.LeaseBucket, port.TasksStream, "KV_" + NodesBucket} {
		seal(t, ctx, e.js, name)
	}
	pollUntil(t, 20*time.Second, "readyz to name the sealed leader bucket and the fix", func() bool {
		p := strings.Join(e.Health(ctx).Problems, "\n")
		return strings.Contains(p, "KV_FLOW_LEADER: sealed") && strings.Contains(p, "FLOW_TASKS: sealed") && strings.Contains(p, "`flowctl cluster repair`")
	})
	pollUntil(t, 20*time.Second, "the node to lose its term on the sealed leader bucket", func() bool { return !e.isLeader() })

	dry, err := e.Ops().RepairStreams(ctx, true)
	if err != nil || len(dry) != 4 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	for _, f := range dry {
		if f.Done || f.Action != "recreate" {
			t.Fatalf("dry run did or would do otherwise: %+v", f)
		}
	}
	if s, _ := e.js.Stream(ctx, "KV_FLOW_LEADER"); !s.CachedInfo().Config.Sealed {
		t.Fatal("the dry run changed the leader bucket")
	}
	repairAt := time.Now()
	done, err := e.Ops().RepairStreams(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	repaired := time.Since(repairAt)
	for _, f := range done {
		if !f.Done {
			t.Fatalf("not repaired: %+v", f)
		}
	}
	pollUntil(t, 30*time.Second, "the node to lead again and be ready", func() bool {
		return e.isLeader() && len(e.Health(ctx).Problems) == 0
	})
	t.Logf("the repair of %d streams took %v; leading and ready %v after it began", len(done), repaired, time.Since(repairAt))
	if after := e.Metrics(ctx).HighestTerm; after <= before {
		t.Fatalf("the term after the repair is %d, not above %d before it", after, before)
	}
	if v := runToEnd(t, e, "one", nil); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("after the repair: %+v", v.Run)
	}

	seal(t, ctx, e.js, "FLOW_LOG")
	found, err := e.Ops().RepairStreams(ctx, false)
	if err != nil || len(found) != 1 || found[0].Action != "refuse" || found[0].Done {
		t.Fatalf("repair of a sealed log: %+v %v; want a refusal", found, err)
	}
	if s, _ := e.js.Stream(ctx, "FLOW_LOG"); s == nil || !s.CachedInfo().Config.Sealed {
		t.Fatal("the log was touched")
	}
	if p := strings.Join(e.Health(ctx).Problems, "\n"); !strings.Contains(p, "FLOW_LOG: sealed") || !strings.Contains(p, "cannot mend it") {
		t.Fatalf("readyz with a sealed log: %q", p)
	}
}

// On an external NATS (a server of its own, not flowd's) a node's credential cannot
// repair: the repair says so (ErrNoAdminPath), and the API does not serve it. Given an
// admin's credential (NATSAdminOptions), the same node repairs a sealed leader bucket
// and leads again.
func TestRepairOnAnExternalServerNeedsAnAdminCredential(t *testing.T) {
	nodePerms, err := client.PermissionsOf(client.RoleNode, "")
	if err != nil {
		t.Fatal(err)
	}
	sp, err := natsnode.ServerPermissions(nodePerms)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "nora", Password: "n-secret", Permissions: sp}, {Username: "root", Password: "r-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server did not start")
	}
	asNode := []nats.Option{nats.UserInfo("nora", "n-secret")}
	for _, admin := range []bool{false, true} {
		t.Run(map[bool]string{false: "node-credential-only", true: "admin-credential"}[admin], func(t *testing.T) {
			e := startEngine(t, func(c *Config) {
				c.NATSURL, c.NATSOptions, c.DataDir = srv.ClientURL(), asNode, filepath.Join(t.TempDir(), "data")
				if admin {
					c.NATSAdminOptions = []nats.Option{nats.UserInfo("root", "r-secret")}
				}
			})
			ctx := ctxT(t, 60*time.Second)
			pollUntil(t, 20*time.Second, "the node to lead", e.isLeader)
			if e.API().CanRepair() != admin {
				t.Fatalf("CanRepair %v with admin %v", e.API().CanRepair(), admin)
			}
			if !admin {
				if _, err := e.Ops().RepairStreams(ctx, false); !errors.Is(err, ErrNoAdminPath) {
					t.Fatalf("a repair on a node's credential: %v; want ErrNoAdminPath", err)
				}
				return
			}
			seal(t, ctx, e.adminJS, "KV_"+epoch.LeaderBucket)
			pollUntil(t, 20*time.Second, "the node to lose its term on the sealed bucket", func() bool { return !e.isLeader() })
			if _, err := e.Ops().RepairStreams(ctx, false); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, 30*time.Second, "the node to lead again and be ready", func() bool {
				return e.isLeader() && len(e.Health(ctx).Problems) == 0
			})
			apply(t, e, oneStepWorkflow)
			if v := runToEnd(t, e, "one", nil); v.Run.Status != checkpoint.StatusSucceeded {
				t.Fatalf("after the repair: %+v", v.Run)
			}
		})
	}
}

// A node whose cluster roster (KV_FLOW_CLUSTER) was sealed while it was down still
// starts (it used to stop: its registration could not be written, and so nothing could
// repair it), says what to run, and the repair mends the roster; it then registers.
func TestStartWithASealedRosterThenRepair(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	first := startEngine(t, func(c *Config) { c.DataDir = dir })
	ctx := ctxT(t, 60*time.Second)
	seal(t, ctx, first.js, "KV_FLOW_CLUSTER")
	if err := first.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Held this time: its registration changes, so it is written.
	e := startEngine(t, func(c *Config) { c.DataDir, c.HoldClusterVersion = dir, true })
	if p := strings.Join(e.Health(ctx).Problems, "\n"); !strings.Contains(p, "KV_FLOW_CLUSTER: sealed") || !strings.Contains(p, "`flowctl cluster repair`") {
		t.Fatalf("readyz with a sealed roster: %q", p)
	}
	if _, err := e.Ops().RepairStreams(ctx, false); err != nil {
		t.Fatal(err)
	}
	if r, err := e.gate.Roster(ctx); err != nil || !r.Members["node-a"].Hold {
		t.Fatalf("the repaired roster: %+v %v; want node-a registered again, with its hold", r, err)
	}
	pollUntil(t, 20*time.Second, "readyz 200 after the repair", func() bool { return len(e.Health(ctx).Problems) == 0 })
	apply(t, e, oneStepWorkflow)
	if v := runToEnd(t, e, "one", nil); v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("after the repair: %+v", v.Run)
	}
}
