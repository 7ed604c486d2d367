package jsport_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/flowrun/flow/internal/base/jsport"
	"github.com/flowrun/flow/internal/base/natsnode"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serverJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv, err := natsnode.Start(natsnode.Config{DataDir: t.TempDir(), NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// wants are one stream, one bucket and one object store, as flow's are made.
func wants() []jsport.Want {
	log := jsport.WantStream(jetstream.StreamConfig{Name: "FLOW_LOG", Subjects: []string{"flow.log"}})
	log.Refuse = "it is the log"
	tasks := jsport.WantStream(jetstream.StreamConfig{Name: "FLOW_TASKS", Subjects: []string{"flow.tasks"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.MemoryStorage, MaxBytes: 1 << 20, Discard: jetstream.DiscardNew})
	tasks.Recreate = true
	leader := jsport.WantKV(jetstream.KeyValueConfig{Bucket: "FLOW_LEADER", History: 1, TTL: 3 * time.Second, LimitMarkerTTL: 3 * time.Second})
	leader.Recreate, leader.KeepSequence = true, true
	snaps := jsport.WantObjectStore(jetstream.ObjectStoreConfig{Bucket: "FLOW_SNAPSHOTS"})
	snaps.Refuse = "they are the snapshots"
	return []jsport.Want{log, tasks, leader, snaps}
}

// What each Want says matches what nats.go makes (no finding on fresh streams); a
// sealed, reconfigured or deny-flagged one is found, a dry run changes nothing, and
// the repair updates what differs only in its settings, recreates what it may (the
// leader bucket's revisions go on above the old ones), and refuses the rest.
func TestCheckAndRepair(t *testing.T) {
	js := serverJS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := wants()
	for _, w := range ws {
		if err := w.Create(ctx, js); err != nil {
			t.Fatal(err)
		}
	}
	if found, err := jsport.Check(ctx, js, ws); err != nil || len(found) != 0 {
		t.Fatalf("fresh streams: %+v %v", found, err)
	}
	kv, _ := js.KeyValue(ctx, "FLOW_LEADER")
	for range 5 {
		if _, err := kv.Put(ctx, "leader", []byte("a")); err != nil {
			t.Fatal(err)
		}
	}
	change := func(name string, f func(*jetstream.StreamConfig)) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := s.CachedInfo().Config
		f(&cfg)
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	change("KV_FLOW_LEADER", func(c *jetstream.StreamConfig) { c.Sealed = true })
	change("FLOW_TASKS", func(c *jetstream.StreamConfig) { c.MaxBytes = 100 })
	change("FLOW_LOG", func(c *jetstream.StreamConfig) { c.DenyPurge = true })
	change("OBJ_FLOW_SNAPSHOTS", func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour })
	want := map[string]string{"KV_FLOW_LEADER": "recreate", "FLOW_TASKS": "update", "FLOW_LOG": "refuse", "OBJ_FLOW_SNAPSHOTS": "update"}
	dry, err := jsport.Repair(ctx, js, ws, true, 0)
	if err != nil || len(dry) != len(want) {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	for _, f := range dry {
		if f.Done || want[f.Stream] != f.Action {
			t.Fatalf("dry run: %+v; want action %s, not done", f, want[f.Stream])
		}
	}
	if found, _ := jsport.Check(ctx, js, ws); len(found) != len(want) {
		t.Fatalf("after the dry run: %+v", found)
	}
	done, err := jsport.Repair(ctx, js, ws, false, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range done {
		if f.Done != (f.Action != "refuse") || want[f.Stream] != f.Action {
			t.Fatalf("repair: %+v", f)
		}
		if f.Action == "refuse" && !strings.Contains(f.String(), "cannot mend it: it is the log") {
			t.Fatalf("a refusal says %q", f.String())
		}
	}
	found, _ := jsport.Check(ctx, js, ws)
	if len(found) != 1 || found[0].Stream != "FLOW_LOG" {
		t.Fatalf("after the repair: %+v", found)
	}
	rev, err := kv.Create(ctx, "leader", []byte("b"))
	if err != nil || rev <= 5 {
		t.Fatalf("the recreated leader bucket's first revision: %d %v; want above the old 5", rev, err)
	}
}
