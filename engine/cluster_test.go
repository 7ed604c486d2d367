package engine

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/engine/internal/gate"
	"github.com/flowrun/flow/engine/internal/nodes"
	"github.com/flowrun/flow/internal/base/natsnode"
	"github.com/flowrun/flow/logstream"
)

// rawFormats reads every message of the log as stored and says each one's format:
// 1 for JSON, 2 for CBOR (the first byte, not flow's decoder).
func rawFormats(t *testing.T, e *Engine) []int {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	s, err := e.js.Stream(ctx, logstream.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		f := 1 // JSON; a CBOR message says its format in its second byte
		if len(m.Data) > 1 && m.Data[0] != '{' {
			f = int(m.Data[1])
		}
		out = append(out, f)
	}
	return out
}

// A cluster of new nodes moves to the newest version at once: the messages before the
// cluster_version entry are format 1, every one after it format 3 (format 2's CBOR), and a run goes
// through in format 2 as in format 1. log dump decodes both.
func TestAFreshClusterWritesFormat2AfterTheRaise(t *testing.T) {
	e := startEngine(t, nil)
	if err := e.Ops().WaitClusterVersion(ctxT(t, 20*time.Second), checkpoint.NewestLogFormat); err != nil {
		t.Fatal(err)
	}
	apply(t, e, "name: hello\nsteps:\n  - {name: a, uses: noop}\n  - {name: b, uses: noop, needs: [a]}\n")
	v := runToEnd(t, e, "hello", nil)
	if v.Run.Status != checkpoint.StatusSucceeded {
		t.Fatalf("run %s", v.Run.Status)
	}
	formats := rawFormats(t, e)
	msgs, _, _, err := e.Ops().DumpLog(ctxT(t, 10*time.Second), 0, "", MaxDumpLimit)
	if err != nil {
		t.Fatal(err)
	}
	raised := -1
	for i, m := range msgs {
		if m.Err != nil {
			t.Fatalf("log dump: sequence %d: %v", m.Seq, m.Err)
		}
		if m.Message.Format != formats[i] {
			t.Fatalf("sequence %d: the dump says format %d, the bytes %d", m.Seq, m.Message.Format, formats[i])
		}
		for _, en := range m.Message.Entries {
			if en.Kind == checkpoint.KindClusterVersion {
				raised = i
			}
		}
	}
	if raised < 0 {
		t.Fatalf("no cluster_version entry in the log: %v", formats)
	}
	for i, f := range formats {
		if want := map[bool]int{true: 1, false: checkpoint.NewestLogFormat}[i <= raised]; f != want {
			t.Fatalf("message %d (the raise at %d) is format %d, want %d: %v", i+1, raised+1, f, want, formats)
		}
	}
	// --run keeps only that run's entries.
	only, _, _, _ := e.Ops().DumpLog(ctxT(t, 10*time.Second), 0, v.Run.ID, MaxDumpLimit)
	kinds := map[checkpoint.Kind]int{}
	for _, m := range only {
		for _, en := range m.Message.Entries {
			if en.Run != v.Run.ID {
				t.Fatalf("log dump --run %s gave an entry of %q", v.Run.ID, en.Run)
			}
			kinds[en.Kind]++
		}
	}
	if kinds[checkpoint.KindSubmit] != 1 || kinds[checkpoint.KindCommit] != 2 || kinds[checkpoint.KindComplete] != 1 {
		t.Fatalf("log dump --run %s: entries %v; want its submit, two commits and its completion", v.Run.ID, kinds)
	}
}

// --hold-cluster-version: the leader looks at the roster and leaves the version at 1;
// everything is written in format 1.
func TestAHeldClusterStaysAtFormat1(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.HoldClusterVersion = true })
	pollUntil(t, 20*time.Second, "two looks of the leader at the roster", func() bool { return e.gatePasses.Load() >= 2 })
	apply(t, e, "name: hello\nsteps:\n  - {name: a, uses: noop}\n")
	runToEnd(t, e, "hello", nil)
	if v := e.store.ClusterVersion(); v != 1 {
		t.Fatalf("cluster version %d under a hold", v)
	}
	for i, f := range rawFormats(t, e) {
		if f != 1 {
			t.Fatalf("message %d is format %d under a hold", i+1, f)
		}
	}
	r, applied, err := e.clusterRoster(ctxT(t, 5*time.Second))
	if _, why := r.Next(applied); err != nil || !strings.Contains(why, "--hold-cluster-version") {
		t.Fatalf("roster %+v, why %q, %v", r, why, err)
	}
}

// Issue 38: a node stopped cleanly (SIGTERM in flowd) says goodbye in its report, so
// that cluster forget takes it at once, as cluster status (LIVE false) suggests, instead
// of refusing it as alive until its report lapses a minute later; and the leader's look
// at the roster does not record it again from its goodbye. A node that runs is refused.
func TestForgetANodeThatStoppedCleanly(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	a := startEngine(t, func(c *Config) { c.NATSURL = srv.ClientURL() })
	pollUntil(t, 20*time.Second, "node-a leads", a.isLeader)
	b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = srv.ClientURL() })
	ctx := ctxT(t, 30*time.Second)
	pollUntil(t, 20*time.Second, "node-b's report", func() bool { // its first is written at its start, but not waited for
		live, err := nodes.Live(ctx, a.ports.Nodes)
		_, ok := live["node-b"]
		return err == nil && ok
	})
	if err := a.Ops().ForgetNode(ctx, "node-b"); !errors.Is(err, gate.ErrLive) {
		t.Fatalf("forget a running node: %v; want it refused as live", err)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Ops().ForgetNode(ctx, "node-b"); err != nil {
		t.Fatalf("forget a node right after its clean stop: %v", err)
	}
	passes := a.gatePasses.Load()
	pollUntil(t, 20*time.Second, "two more looks of the leader at the roster", func() bool { return a.gatePasses.Load() >= passes+2 })
	r, _, err := a.clusterRoster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Members["node-b"]; ok || len(r.Members) != 1 {
		t.Fatalf("members %v: the forgotten node was recorded again from its goodbye", r.IDs())
	}
}
