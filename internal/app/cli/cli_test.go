package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/epoch"
	"github.com/flowrun/flow/internal/app/apiserver"
	"github.com/flowrun/flow/internal/app/apiserver/apitest"
	"github.com/flowrun/flow/internal/app/daemon"
	"github.com/flowrun/flow/internal/base/testhooks"
	"github.com/flowrun/flow/internal/testkit/forge"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	t      *testing.T
	server string
	dir    string
	d      *daemon.Daemon
}

func startFlowd(t *testing.T) *env {
	dir := t.TempDir()
	args := []string{"--data-dir", filepath.Join(dir, "data"), "--nats-listen", "127.0.0.1:0", "--http", "off",
		"--node-id", "node-a", "--lease-ttl", "1s"}
	if os.Geteuid() == 0 {
		// Its steps write the test's files (t.TempDir: root's, 0700), so they run as
		// root, the one way back (issue 36); as a plain user they are flowd's own.
		args = append(args, "--exec-user", "root")
	}
	cfg, err := daemon.Load(args, []string{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := daemon.Start(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	// The leader raises the cluster version soon after it starts (an entry in the log):
	// tests that count the log's messages start after it.
	if err := d.Engine().Ops().WaitClusterVersion(ctx, checkpoint.NewestLogFormat); err != nil {
		t.Fatalf("the cluster version never reached %d: %v", checkpoint.NewestLogFormat, err)
	}
	return &env{t: t, server: d.Engine().ClientURL(), dir: dir, d: d}
}

// flowctl runs a command and returns its exit code, stdout and stderr.
func (e *env) flowctl(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := Run(append([]string{"--server", e.server}, args...), &out, &errOut, func(string) string { return "" })
	return code, out.String(), errOut.String()
}

func (e *env) file(name, content string) string {
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func TestCommands(t *testing.T) {
	e := startFlowd(t)
	good := e.file("hello.yaml", "name: hello\ninputs:\n  n: {type: int, default: 1}\nsteps:\n  - name: a\n    uses: noop\n    with: {n: \"{{ inputs.n }}\"}\n  - name: b\n    needs: [a]\n    uses: noop\n")
	bad := e.file("bad.yaml", "name: bad\nsteps:\n  - name: a\n    uses: teleport\n")
	failing := e.file("fails.yaml", "name: fails\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n")

	if code, out, _ := e.flowctl("workflow", "validate", "-f", good); code != 0 || !strings.Contains(out, "is valid") {
		t.Fatalf("validate good: %d %q", code, out)
	}
	code, _, errOut := e.flowctl("workflow", "validate", "-f", bad)
	if code != 2 || !strings.Contains(errOut, "bad.yaml:4:11: step \"a\" uses unknown kind \"teleport\"") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("validate bad: %d %q", code, errOut)
	}
	applied := e.d.Engine().Applied()
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", bad); code != 2 || e.d.Engine().Applied() != applied {
		t.Fatalf("apply bad: %d %q; state changed: %v", code, errOut, e.d.Engine().Applied() != applied)
	}
	if code, out, _ := e.flowctl("workflow", "apply", "-f", good); code != 0 || !strings.Contains(out, "version 1") {
		t.Fatalf("apply: %d %q", code, out)
	}
	if code, _, _ := e.flowctl("workflow", "apply", "-f", failing); code != 0 {
		t.Fatal("apply failing")
	}
	code, out, _ := e.flowctl("-o", "json", "workflow", "list")
	var wfs []client.Workflow
	if code != 0 || json.Unmarshal([]byte(out), &wfs) != nil || len(wfs) != 2 {
		t.Fatalf("workflow list: %d %q", code, out)
	}

	// run start --wait: 0 on success, 1 on a failed run.
	code, out, _ = e.flowctl("run", "start", "hello", "--input", "n=5", "--wait", "--id", "r-ok")
	if code != 0 || !strings.Contains(out, "r-ok") {
		t.Fatalf("run start --wait: %d %q", code, out)
	}
	if code, _, errOut := e.flowctl("run", "start", "fails", "--wait", "--id", "r-bad"); code != 1 || !strings.Contains(errOut, "failed") {
		t.Fatalf("failing run: %d %q", code, errOut)
	}
	// run get -o json: the contract's shape.
	code, out, _ = e.flowctl("run", "get", "r-ok", "-o", "json")
	var run map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &run) != nil {
		t.Fatalf("run get: %d %q", code, out)
	}
	for _, k := range []string{"id", "workflow", "version", "status", "trigger", "epoch", "epoch_changes", "max_epochs", "steps", "epochs", "fenced"} {
		if _, ok := run[k]; !ok {
			t.Fatalf("run get -o json lacks %q: %s", k, out)
		}
	}
	steps := run["steps"].([]any)
	st := steps[0].(map[string]any)
	for _, k := range []string{"name", "status", "attempts", "epoch", "items", "items_done", "output"} {
		if _, ok := st[k]; !ok {
			t.Fatalf("step lacks %q: %v", k, st)
		}
	}
	if run["status"] != "succeeded" || run["trigger"] != "manual" || st["output"].(map[string]any)["n"] != float64(5) {
		t.Fatalf("run %v", run)
	}
	code, out, _ = e.flowctl("run", "list", "-o", "json", "--workflow", "hello")
	var runs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &runs) != nil || len(runs) != 1 || runs[0]["id"] != "r-ok" {
		t.Fatalf("run list: %d %q", code, out)
	}
	if code, out, _ := e.flowctl("-o", "yaml", "run", "get", "r-ok"); code != 0 || !strings.Contains(out, "status: succeeded") {
		t.Fatalf("yaml: %d %q", code, out)
	}
	// Tables fit 80 columns.
	for _, args := range [][]string{{"run", "get", "r-ok"}, {"run", "list"}, {"workflow", "list"}, {"run", "history", "r-ok"}, {"cluster", "status"}} {
		code, out, _ := e.flowctl(args...)
		if code != 0 {
			t.Fatalf("%v: %d", args, code)
		}
		for _, l := range strings.Split(out, "\n") {
			if len(l) > 80 {
				t.Fatalf("%v: line over 80 columns: %q", args, l)
			}
		}
	}
	if code, out, _ := e.flowctl("run", "verify", "r-ok"); code != 0 || !strings.Contains(out, "r-ok: ok") {
		t.Fatalf("verify: %d %q", code, out)
	}
	code, out, _ = e.flowctl("cluster", "status", "-o", "json")
	var cs client.ClusterStatus
	if code != 0 || json.Unmarshal([]byte(out), &cs) != nil || cs.Leader != "node-a" || cs.Term == 0 || len(cs.Nodes) != 1 || cs.Nodes[0].Applied == 0 {
		t.Fatalf("cluster status: %d %q", code, out)
	}
	// retry the failed run (it fails again), cancel a finished one (conflict: 1).
	if code, _, _ := e.flowctl("run", "retry", "r-bad"); code != 0 {
		t.Fatal("retry")
	}
	if code, out, _ := e.flowctl("run", "watch", "r-bad"); code != 1 || !strings.Contains(out, "failed") {
		t.Fatalf("watch a failing run: %d %q", code, out)
	}
	if code, _, _ := e.flowctl("run", "cancel", "r-ok"); code != 1 {
		t.Fatalf("cancel a finished run: %d, want 1", code)
	}

	// --priority rides with the run: run get -o json says it.
	if code, _, errOut := e.flowctl("run", "start", "hello", "--input", "n=1", "--wait", "--id", "r-prio", "--priority", "-7"); code != 0 {
		t.Fatalf("run start --priority: %d %q", code, errOut)
	}
	if code, out, _ := e.flowctl("-o", "json", "run", "get", "r-prio"); code != 0 || !strings.Contains(out, `"priority": -7`) {
		t.Fatalf("run get of a run of priority -7: %d %s", code, out)
	}

	// Bad input: one-line message, exit 2, nothing changed on the server.
	applied = e.d.Engine().Applied()
	for _, args := range [][]string{
		{"run", "get", "no-such-run"},
		{"run", "start", "hello", "--input", "n"},
		{"run", "start", "hello", "--input", "n=five"},
		{"run", "start", "hello", "--input", "m=1"},
		{"run", "start", "nope"},
		{"run", "start", "hello", "--priority", "101"},
		{"run", "start", "hello", "--priority", "high"},
		{"run", "list", "--status", "runing"},
		{"run", "frobnicate"},
		{"-o", "xml", "run", "list"},
		{"--nope"},
	} {
		code, _, errOut := e.flowctl(args...)
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.HasPrefix(errOut, "flowctl: ") && !strings.Contains(errOut, "unknown") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, errOut)
		}
	}
	if e.d.Engine().Applied() != applied {
		t.Fatal("bad input changed the server's state")
	}
	// Unreachable: 3.
	var o, eo bytes.Buffer
	if code := Run([]string{"--server", "nats://127.0.0.1:1", "run", "list"}, &o, &eo, func(string) string { return "" }); code != 3 {
		t.Fatalf("unreachable: %d %q", code, eo.String())
	}
	if code, out, _ := e.flowctl("completion", "bash"); code != 0 || !strings.Contains(out, "flowctl") {
		t.Fatalf("completion: %d", code)
	}
}

// run verify fails on a state built with the epoch check disabled (negative control).
func TestVerifyCatchesAStaleCommit(t *testing.T) {
	eng, err := engine.New(engine.Config{NodeID: "n", DataDir: t.TempDir(), NATSListen: "127.0.0.1:0",
		Lease: epoch.Config{TTL: time.Second}, DisableScheduler: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eng.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer eng.Stop(ctx)
	// The API serves runs from a state written with the epoch check off.
	state := apitest.NewGuardsOff(t, &testhooks.Hooks{NoEpochCheck: true})
	srv, err := apiserver.Serve(apiserver.Config{Node: apitest.Node{API: eng.API(), State: state}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	w := func(e checkpoint.Entry) uint64 {
		seq, verdicts := state.Write(t, e)
		if verdicts[0] != nil {
			t.Fatalf("%s: %v", e.Kind, verdicts[0])
		}
		return seq
	}
	w(checkpoint.Entry{Kind: checkpoint.KindSubmit, Run: "z", Submit: &checkpoint.Submit{Workflow: "zz", Trigger: "manual", Steps: []checkpoint.StepSpec{{Name: "a"}}}})
	e1 := int64(w(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "z", Term: 1 << 40}))
	w(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "z", Epoch: e1, Owner: "old"})
	e2 := int64(w(checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "z", Epoch: e1, Term: 1 << 40}))
	w(checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "z", Epoch: e2, Owner: "new"})
	w(checkpoint.Entry{Kind: checkpoint.KindCommit, Run: "z", Step: "a", Item: -1, Epoch: e1, Owner: "old", Output: json.RawMessage(`{}`)})
	var out, errOut bytes.Buffer
	code := Run([]string{"--server", eng.ClientURL(), "run", "verify", "z"}, &out, &errOut, func(string) string { return "" })
	if code != 1 || !strings.Contains(out.String(), "VIOLATION: commit of a item -1") {
		t.Fatalf("verify: exit %d\n%s%s", code, out.String(), errOut.String())
	}
}

func TestDrillZombie(t *testing.T) {
	e := startFlowd(t)
	code, out, errOut := e.flowctl("drill", "zombie")
	reclaimed := strings.Contains(out, "lease-expired") || strings.Contains(out, "reconciled")
	if code != 0 || !strings.Contains(out, "FENCED: node-a's commit of step pause") || !reclaimed || !strings.Contains(out, "verify: ok") {
		t.Fatalf("drill: %d\n%s%s", code, out, errOut)
	}
}

// A run that loses its owner more than max_epochs times ends in the DLQ; flowctl lists,
// shows, and purges it.
func TestDeadLetterQueue(t *testing.T) {
	e := startFlowd(t)
	// An exec step holds its worker (a sleep this long would park the run: issue 26).
	wf := e.file("slow.yaml", "name: slow\nmax_epochs: 1\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [sleep, \"3600\"]}\n")
	if code, _, errOut := e.flowctl("workflow", "apply", "-f", wf); code != 0 {
		t.Fatal(errOut)
	}
	if code, _, errOut := e.flowctl("run", "start", "slow", "--id", "dl-1"); code != 0 {
		t.Fatal(errOut)
	}
	eng := e.d.Engine()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deadline := time.Now().Add(20 * time.Second)
	var r *checkpoint.Run
	for {
		if v, _ := eng.Run("dl-1"); v != nil && v.Run.Status == checkpoint.StatusRunning {
			r = &v.Run
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never started")
		}
		time.Sleep(10 * time.Millisecond) // polling the state, with a deadline
	}
	// Its owner is lost once (a reclaim), and the next owner claims and vanishes: the
	// reconciler's reclaim is the second counted change, more than max_epochs 1.
	leader, err := eng.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := forge.Open(t, eng.ClientURL())
	assign, err := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindAssign, Run: "dl-1", Epoch: r.Epoch, Term: leader.Term, Owner: "test", Reason: checkpoint.ReasonLeaseExpired})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, checkpoint.Entry{Kind: checkpoint.KindClaim, Run: "dl-1", Epoch: int64(assign), Owner: "ghost"}); err != nil {
		t.Fatal(err)
	}
	for {
		if v, _ := eng.Run("dl-1"); v != nil && v.Run.Status == checkpoint.StatusDeadLettered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never reached the DLQ")
		}
		time.Sleep(10 * time.Millisecond) // polling the state, with a deadline
	}
	code, out, _ := e.flowctl("dlq", "list", "-o", "json")
	var runs []client.Run
	if code != 0 || json.Unmarshal([]byte(out), &runs) != nil || len(runs) != 1 || runs[0].ID != "dl-1" {
		t.Fatalf("dlq list: %d %s", code, out)
	}
	code, out, _ = e.flowctl("dlq", "show", "dl-1", "-o", "json")
	var shown client.Run
	if code != 0 || json.Unmarshal([]byte(out), &shown) != nil || shown.DeadLetter == "" || len(shown.Epochs) < 2 {
		t.Fatalf("dlq show: %d %s", code, out)
	}
	// The DLQ stream carries a notice for it.
	js, err := jetstream.New(w.Conn())
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "FLOW_DLQ")
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := st.GetLastMsgForSubject(ctx, "flow.dlq.dl-1")
		if err == nil && strings.Contains(string(m.Data), `"run":"dl-1"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no DLQ notice for dl-1: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the stream, with a deadline
	}
	if code, _, _ := e.flowctl("dlq", "purge", "dl-1"); code != 0 {
		t.Fatal("purge")
	}
	if code, _, errOut := e.flowctl("dlq", "show", "dl-1"); code != 2 || !strings.Contains(errOut, "not in the dead-letter queue") {
		t.Fatalf("dlq show after purge: %d %q", code, errOut)
	}
	if v, _ := eng.Run("dl-1"); v == nil || v.Run.Status != checkpoint.StatusCancelled {
		t.Fatalf("purged run is %+v", v)
	}
}
