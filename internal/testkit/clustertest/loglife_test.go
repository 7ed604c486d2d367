package clustertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/within"
)

// The log's lifetime (issue 14): what a real flowd does when the log it finds is not
// what it applied, or holds what it cannot read.

// logCtx is a context for a test's own calls to NATS.
func logCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// jsOf connects the test to the cluster's JetStream.
func jsOf(t *testing.T, c *Cluster) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(c.URL())
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

// serving waits until the cluster answers with a leader and the nodes named.
func serving(t *testing.T, cl *client.Client, nodes int) {
	t.Helper()
	WaitFor(t, 60*time.Second, fmt.Sprintf("%d nodes and a leader", nodes), func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Leader != "" && len(st.Nodes) == nodes
	})
}

// runOne starts a one-step run and waits for it to succeed.
func runOne(t *testing.T, cl *client.Client, id string) {
	t.Helper()
	if err := call(t, cl, "run.start", client.Request{Workflow: "one", ID: id}, nil); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	WaitFor(t, 60*time.Second, "run "+id+" to succeed", func() bool {
		var r client.Run
		return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && r.Status == "succeeded"
	})
}

const oneStep = "name: one\nsteps:\n  - name: a\n    uses: noop\n"

// logLife starts one NATS server and the flowd nodes named (with extra flags for the
// first), waits until they serve, and applies the one-step workflow.
func logLife(t *testing.T, first []string, names ...string) (*Cluster, *client.Client, []*Proc) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts NATS and flowd processes")
	}
	c := StartNATS(t, 1)
	waitJetStream(t, c)
	var nodes []*Proc
	for i, name := range names {
		var extra []string
		if i == 0 {
			extra = first
		}
		nodes = append(nodes, StartFlowd(t, c, name, extra...))
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s:\n%s", n.Name, tail(LogOf(n)))
			}
		}
	})
	cl := dial(t, c)
	serving(t, cl, len(names))
	if err := call(t, cl, "workflow.apply", client.Request{File: "one.yaml", YAML: oneStep}, nil); err != nil {
		t.Fatal(err)
	}
	return c, cl, nodes
}

// Garbage published to the log (7 bytes, from any client that can reach NATS) is
// rejected at its sequence by every node, and applying goes on: both nodes keep
// answering and a run started after it succeeds. Deleting the message, which then is the
// log's last, does not leave a restarted node waiting for it forever either. (Before:
// one malformed message stopped every applier, and after its removal a restarted node
// waited for the deleted sequence for good.)
func TestGarbageInTheLogStopsNoNode(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	c, cl, nodes := logLife(t, nil, "node-a", "node-b")
	na, nb := nodes[0], nodes[1]
	runOne(t, cl, "before")
	js := jsOf(t, c)
	ctx := logCtx(t)
	ack, err := js.Publish(ctx, "flow.log", []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	runOne(t, cl, "after")
	WaitFor(t, 30*time.Second, "both nodes past the garbage", func() bool {
		var st client.ClusterStatus
		if call(t, cl, "cluster.status", client.Request{}, &st) != nil || len(st.Nodes) != 2 {
			return false
		}
		for _, n := range st.Nodes {
			if n.Applied <= ack.Sequence {
				return false
			}
		}
		return true
	})

	// The garbage again, now as the log's last message, with node-b down; then deleted.
	nb.Kill()
	ack, err = js.Publish(ctx, "flow.log", []byte("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "FLOW_LOG")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, ack.Sequence); err != nil {
		t.Fatal(err)
	}
	na.Kill()
	nb.Restart(t)
	serving(t, cl, 1) // every answer needs the node caught up: it is, past the deleted tail
	na.Restart(t)
	serving(t, cl, 2)
	runOne(t, cl, "after-delete")
}

// A stream deleted and created again restarts its sequences. A node consuming it stops
// with exit code 1 and says what happened and how to recover, and it refuses to start
// on it again; a node with an empty data dir starts on the new stream. (Before: the node
// served its stale state and timed out on every write.)
func TestRecreatedLogIsRefused(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	c, cl, nodes := logLife(t, nil, "node-a")
	na := nodes[0]
	runOne(t, cl, "before")
	js := jsOf(t, c)
	ctx := logCtx(t)
	stream, err := js.Stream(ctx, "FLOW_LOG")
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	if err := js.DeleteStream(ctx, "FLOW_LOG"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	refused := func(what string) {
		t.Helper()
		WaitFor(t, 60*time.Second, what, func() bool { return !na.Alive() })
		log := LogOf(na)
		if na.ExitCode() != 1 || !strings.Contains(log, "deleted and created again") || !strings.Contains(log, "move its state aside") {
			t.Fatalf("%s: exit %d; want 1 and a log saying the stream was recreated and how to recover:\n%s", what, na.ExitCode(), tail(log))
		}
	}
	refused("node-a to stop when its stream was recreated")
	na.Restart(t)
	refused("node-a to refuse to start on the recreated stream")
	// Control: a node with a new state starts on the new stream and serves.
	StartFlowd(t, c, "node-b")
	serving(t, cl, 1)
}

// The log purged past what a stopped node applied, with no snapshot to bridge the gap:
// the node refuses to start (exit 1, saying messages were purged and how to recover)
// instead of coming back ready with a fraction of the runs and no workflows.
func TestTruncatedLogIsRefused(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	c, cl, nodes := logLife(t, nil, "node-a", "node-b")
	na, nb := nodes[0], nodes[1]
	runOne(t, cl, "r1")
	nb.Kill()
	for i := 2; i <= 4; i++ {
		runOne(t, cl, fmt.Sprintf("r%d", i))
	}
	js := jsOf(t, c)
	ctx := logCtx(t)
	stream, err := js.Stream(ctx, "FLOW_LOG")
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(info.State.LastSeq-1)); err != nil {
		t.Fatal(err)
	}
	nb.Restart(t)
	WaitFor(t, 60*time.Second, "node-b to refuse the truncated log", func() bool { return !nb.Alive() })
	if log := LogOf(nb); nb.ExitCode() != 1 || !strings.Contains(log, "purged") || !strings.Contains(log, "move its state aside") {
		t.Fatalf("node-b on a truncated log: exit %d; want 1 and a log saying messages were purged:\n%s", nb.ExitCode(), tail(log))
	}
	if !na.Alive() {
		t.Fatalf("node-a, which applied everything, stopped:\n%s", tail(LogOf(na)))
	}
}

// One entry with a huge term, published by anything that reaches NATS: the nodes go on
// scheduling (the leader raises the bucket's terms above it) instead of rejecting every
// later assign as stale and spinning on their own rejections while /readyz says ready.
func TestHighTermDoesNotStopScheduling(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	c, cl, _ := logLife(t, nil, "node-a")
	runOne(t, cl, "before")
	const forged = int64(1) << 40
	entry := fmt.Sprintf(`{"v":1,"node":"forger","entries":[{"k":"cron_tick","term":%d,"owner":"forger","tick":{"workflow":"one","at":"2026-12-01T02:00:00Z","outcome":"skipped-overlap"},"at":"2026-12-01T02:00:00Z"}]}`, forged)
	if _, err := jsOf(t, c).Publish(logCtx(t), "flow.log", []byte(entry)); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 60*time.Second, "a leader term above the forged one", func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Term > forged
	})
	runOne(t, cl, "after")
}

// Snapshots and compaction with real processes: a node snapshotting every 100 messages
// compacts the log; a node with an empty data dir joins from the newest snapshot and
// the log after it; a node SIGKILLed while it writes a snapshot starts again and
// serves (a half-written snapshot is never used: it is written under a name of its own
// and renamed when complete).
func TestJoinFromASnapshotAfterCompaction(t *testing.T) {
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	c, cl, nodes := logLife(t, []string{"--snapshot-every", "100"}, "node-a")
	na := nodes[0]
	for i := range 45 {
		runOne(t, cl, fmt.Sprintf("r%02d", i))
	}
	var st client.ClusterStatus
	WaitFor(t, 60*time.Second, "a snapshot and a compacted log", func() bool {
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.SnapshotSeq > 0 && st.FirstSeq > 1
	})
	if st.FirstSeq > st.SnapshotSeq+1 {
		t.Fatalf("the log starts at %d, past the newest snapshot at %d", st.FirstSeq, st.SnapshotSeq)
	}
	nb := StartFlowd(t, c, "node-b", "--scheduler=false")
	serving(t, cl, 2)
	WaitFor(t, 60*time.Second, "node-b caught up", func() bool {
		var now client.ClusterStatus
		if call(t, cl, "cluster.status", client.Request{}, &now) != nil {
			return false
		}
		for _, n := range now.Nodes {
			if n.ID == "node-b" && n.Applied >= st.LastSeq {
				return true
			}
		}
		return false
	})
	if !strings.Contains(LogOf(nb), "restored the newest snapshot") {
		t.Fatalf("node-b did not start from the snapshot:\n%s", tail(LogOf(nb)))
	}
	// Every run, asked of node-b alone.
	na.Kill()
	serving(t, cl, 1)
	var runs []client.Run
	if err := call(t, cl, "run.list", client.Request{Limit: 1000}, &runs); err != nil || len(runs) != 45 {
		t.Fatalf("node-b knows %d runs (%v), want 45", len(runs), err)
	}
	// A kill while a snapshot is being written: the node starts again and serves.
	na.Restart(t)
	serving(t, cl, 2)
	asked := make(chan struct{})
	go func() { // its answer may never come: the node is killed while it writes
		defer close(asked)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = cl.Snapshot(ctx)
	}()
	na.Kill()
	na.Restart(t)
	serving(t, cl, 2)
	runOne(t, cl, "after")
	within.Recv(t, 30*time.Second, asked, "the snapshot request's end")
}

// A read of this node's Pebble that fails during apply stops the applier (the node says
// so in /readyz and answers no request from a state it could not update) instead of
// becoming that entry's rejection while the batch commits, which silently made the node
// diverge from the others. The failure is injected at link time for one run's record.
// Control: the same run on a node built normally succeeds.
func TestStorageFailureStopsTheNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds flowd with an injected fault and starts processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	faulty := FlowdLinkedWith(t, "github.com/flowrun/flow/checkpoint.failReadOf=r/victim")
	c := StartNATS(t, 1)
	waitJetStream(t, c)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePorts(t, 1)[0])
	na := StartFlowd(t, c, "node-a", "--http", httpAddr)
	na.Kill()
	na.args[0] = faulty
	na.Restart(t)
	nb := StartFlowd(t, c, "node-b")
	defer func() {
		if t.Failed() {
			t.Logf("node-a:\n%s\nnode-b:\n%s", tail(LogOf(na)), tail(LogOf(nb)))
		}
	}()
	cl := dial(t, c)
	serving(t, cl, 2)
	if err := call(t, cl, "workflow.apply", client.Request{File: "one.yaml", YAML: oneStep}, nil); err != nil {
		t.Fatal(err)
	}
	runOne(t, cl, "control") // any run but the victim: both nodes apply it
	_ = call(t, cl, "run.start", client.Request{Workflow: "one", ID: "victim"}, nil)
	readyz := func() (int, string) {
		hc := http.Client{Timeout: 3 * time.Second}
		resp, err := hc.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	WaitFor(t, 60*time.Second, "node-a's /readyz to say its applier stopped on the storage failure", func() bool {
		code, body := readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "the applier stopped") && strings.Contains(body, "state storage failed")
	})
	// node-b, built normally, applied the same entries: the victim runs to its end there.
	WaitFor(t, 60*time.Second, "the victim to succeed on node-b", func() bool {
		var r client.Run
		return call(t, cl, "run.get", client.Request{ID: "victim"}, &r) == nil && r.Status == "succeeded"
	})
}
