package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// A node SIGKILLed in the middle of a snapshot's upload, of a purge of the log (with the
// embedded server, which dies with it), and of a restore still starts, serves every run
// and goes on. Each crash is placed by a flowd built with a fault hook at link time
// (logstream.haltSnapshotAfter, engine.killDuringPurge, checkpoint.haltRestoreAfter);
// the node then starts again on the normal build with the data it left.
func TestCrashDuringSnapshotRestoreAndPurge(t *testing.T) {
	if testing.Short() {
		t.Skip("builds flowd with fault hooks and starts processes")
	}
	t.Parallel() // no timing assertion: it runs beside the others (docs/testing.md, "How the suite is run")
	haltSnapshot := FlowdLinkedWith(t, "github.com/flowrun/flow/logstream.haltSnapshotAfter=32768")
	killPurge := FlowdLinkedWith(t, "github.com/flowrun/flow/engine.killDuringPurge=1")
	haltRestore := FlowdLinkedWith(t, "github.com/flowrun/flow/checkpoint.haltRestoreAfter=65536")
	normal := filepath.Join(Binaries(t), "flowd")
	dir := t.TempDir()
	port := freePorts(t, 1)[0]
	c := &Cluster{URLs: []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}}
	node := func(name, bin string, extra ...string) *Proc {
		logf, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{bin, "--node-id", name, "--data-dir", filepath.Join(dir, name), "--http", "off", "--log-format", "json"}, extra...)
		p := &Proc{Name: name, log: logf, args: args}
		p.start(t)
		t.Cleanup(p.Kill)
		return p
	}
	var cl *client.Client
	restartAs := func(p *Proc, bin string) {
		p.Kill()
		p.args[0] = bin
		p.Restart(t)
		waitJetStream(t, c)
		cl = dial(t, c) // the client does not reconnect (MaxReconnects 0) and node-a's server died
	}
	// node-a embeds the server, snapshots every 100 messages and halts its uploads.
	na := node("node-a", haltSnapshot, "--nats-listen", fmt.Sprintf("127.0.0.1:%d", port), "--snapshot-every", "100", "--lease-ttl", "1s")
	var nb *Proc
	defer func() {
		if t.Failed() {
			t.Logf("node-a:\n%s", tail(LogOf(na)))
			if nb != nil {
				t.Logf("node-b:\n%s", tail(LogOf(nb)))
			}
		}
	}()
	waitJetStream(t, c)
	cl = dial(t, c)
	serving(t, cl, 1)
	if err := call(t, cl, "workflow.apply", client.Request{File: "one.yaml", YAML: oneStep}, nil); err != nil {
		t.Fatal(err)
	}
	status := func() client.ClusterStatus {
		var st client.ClusterStatus
		if err := call(t, cl, "cluster.status", client.Request{}, &st); err != nil {
			return client.ClusterStatus{}
		}
		return st
	}
	allSucceeded := func(want int) {
		t.Helper()
		WaitFor(t, 60*time.Second, fmt.Sprintf("%d runs, every one succeeded", want), func() bool {
			var runs []client.Run
			if call(t, cl, "run.list", client.Request{Limit: 1000}, &runs) != nil || len(runs) < want {
				return false
			}
			for _, r := range runs {
				if r.Status != "succeeded" {
					return false
				}
			}
			return true
		})
	}

	// 1. A kill in the middle of a snapshot's upload (32 KiB of it sent).
	for i := range 80 {
		runOne(t, cl, fmt.Sprintf("a%02d", i))
	}
	WaitFor(t, 60*time.Second, "node-a's snapshot upload to halt", func() bool {
		return strings.Contains(LogOf(na), "snapshot upload halted for a test")
	})
	if st := status(); st.SnapshotSeq != 0 || st.FirstSeq != 1 {
		t.Fatalf("a halted upload shows as a snapshot (%d) or let the log be purged (first %d)", st.SnapshotSeq, st.FirstSeq)
	}
	restartAs(na, normal)
	serving(t, cl, 1)
	allSucceeded(80)
	runOne(t, cl, "after-upload-crash")
	WaitFor(t, 60*time.Second, "a snapshot and a compacted log", func() bool {
		st := status()
		return st.SnapshotSeq > 0 && st.FirstSeq > 1 && st.FirstSeq <= st.SnapshotSeq+1
	})

	// 2. A kill (of flowd and the embedded server in it) in the middle of a purge.
	restartAs(na, killPurge)
	serving(t, cl, 1)
	started := 81
	for i := 0; na.Alive() && i < 400; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if callCtx(ctx, cl, "run.start", client.Request{Workflow: "one", ID: fmt.Sprintf("b%03d", i)}, nil) == nil {
			started++
		}
		cancel()
	}
	WaitFor(t, 60*time.Second, "node-a to kill itself during a purge", func() bool { return !na.Alive() })
	if !strings.Contains(LogOf(na), "kills itself during the purge") {
		t.Fatalf("node-a died, but not in a purge")
	}
	restartAs(na, normal)
	serving(t, cl, 1)
	allSucceeded(started)
	runOne(t, cl, "after-purge-crash")
	var before client.ClusterStatus
	WaitFor(t, 60*time.Second, "a newer snapshot and the log compacted to it", func() bool {
		before = status()
		return before.SnapshotSeq > 0 && before.FirstSeq == before.SnapshotSeq+1
	})

	// 3. A kill in the middle of a restore: node-b joins with an empty data dir, so it
	// restores the newest snapshot; killed halfway, it has no state (never half of one),
	// and its next start restores again.
	nb = node("node-b", haltRestore, "--nats-url", c.URL(), "--scheduler=false")
	WaitFor(t, 60*time.Second, "node-b's restore to halt", func() bool {
		return strings.Contains(LogOf(nb), "restore halted for a test")
	})
	nb.Kill()
	if _, err := os.Stat(filepath.Join(dir, "node-b", "state")); !os.IsNotExist(err) {
		t.Fatalf("a restore killed halfway left a state behind (%v)", err)
	}
	restartAs(nb, normal)
	serving(t, cl, 2)
	WaitFor(t, 60*time.Second, "node-b caught up", func() bool {
		for _, n := range status().Nodes {
			if n.ID == "node-b" && n.Applied >= before.LastSeq {
				return true
			}
		}
		return false
	})
	if !strings.Contains(LogOf(nb), "restored the newest snapshot") {
		t.Fatalf("node-b did not start from the snapshot")
	}
	if _, err := os.Stat(filepath.Join(dir, "node-b", "state.restoring")); !os.IsNotExist(err) {
		t.Fatalf("the killed restore's folder is still there (%v)", err)
	}
	runOne(t, cl, "after-restore-crash")
}
