package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/cli"
)

// A bulk retry across a leader SIGKILL: three flowd on one NATS server, 50 failed runs
// (a step that fails at once, so a retried run is failed again within a moment);
// flowctl's `run retry --workflow` runs while the leader is killed. Every run is retried
// exactly once by the operation (one accepted retry naming it in each history), however
// many of flowctl's requests the dying node swallowed: a lost try is asked again only
// when the history shows it did not land.
func TestBulkRetryAcrossALeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process")
	}
	t.Parallel()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	nodes := map[string]*Proc{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		nodes[n] = StartFlowd(t, c, n, "--lease-ttl", "2s")
	}
	cl := dial(t, c)
	leader := func() string {
		var st client.ClusterStatus
		if call(t, cl, "cluster.status", client.Request{}, &st) != nil {
			return ""
		}
		return st.Leader
	}
	WaitFor(t, 30*time.Second, "a leader", func() bool { return leader() != "" })
	yaml := "name: flaky\nsteps:\n  - name: a\n    uses: exec\n    with: {command: [\"false\"]}\n"
	WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
		return call(t, cl, "workflow.apply", client.Request{File: "f.yaml", YAML: yaml}, nil) == nil
	})
	const runs = 50
	for i := range runs {
		id := fmt.Sprintf("f-%02d", i)
		WaitFor(t, 30*time.Second, "start "+id, func() bool {
			err := call(t, cl, "run.start", client.Request{Workflow: "flaky", ID: id}, nil)
			return err == nil || strings.Contains(err.Error(), "exists")
		})
	}
	failed := func() int {
		var rs []client.Run
		if call(t, cl, "run.list", client.Request{Workflow: "flaky", Status: "failed", Limit: 1000}, &rs) != nil {
			return -1
		}
		return len(rs)
	}
	WaitFor(t, 120*time.Second, "the 50 runs failed", func() bool { return failed() == runs })

	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var out, errOut strings.Builder
		code := cli.Run([]string{"--server", url, "-o", "json", "run", "retry", "--workflow", "flaky", "--max-parallel", "2"}, &out, &errOut, func(string) string { return "" })
		done <- result{code, out.String(), errOut.String()}
	}()
	// The leader dies once the operation is under way: some runs retried, not all.
	retried := func() int {
		var rs []client.Run
		if call(t, cl, "run.list", client.Request{Workflow: "flaky", Limit: 1000}, &rs) != nil {
			return 0
		}
		n := 0
		for _, r := range rs {
			if r.Epoch > 0 && len(r.Epochs) > 1 {
				n++
			}
		}
		return n
	}
	WaitFor(t, 60*time.Second, "the bulk retry under way", func() bool { return retried() >= 5 })
	killed := leader()
	nodes[killed].Kill()
	var res result
	select {
	case res = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatal("flowctl's bulk retry never ended")
	}
	var op cli.BulkResult
	if err := json.Unmarshal([]byte(res.out), &op); err != nil || len(op.Runs) != runs {
		t.Fatalf("flowctl: exit %d, %q %q (%v)", res.code, res.out, res.err, err)
	}
	outcomes := map[string]int{}
	for _, o := range op.Runs {
		outcomes[o.Outcome]++
	}
	t.Logf("leader %s killed during the bulk retry of %d runs: outcomes %v, exit %d", killed, runs, outcomes, res.code)
	// Each run's history: one accepted retry naming the operation (a run whose change
	// stayed unknown after five tries counts as not retried: none may be retried twice).
	for i := range runs {
		id := fmt.Sprintf("f-%02d", i)
		var evs []client.Event
		WaitFor(t, 30*time.Second, "the history of "+id, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			h, err := cl.History(ctx, id)
			evs = h
			return err == nil
		})
		n := 0
		for _, ev := range evs {
			if ev.Kind == "retry" && ev.Outcome == "accepted" && strings.Contains(ev.Detail, op.Operation) {
				n++
			}
		}
		if n > 1 {
			t.Errorf("%s was retried %d times by %s", id, n, op.Operation)
		}
		if n == 0 && outcomes["unknown"] == 0 && outcomes["refused"] == 0 {
			t.Errorf("%s was not retried, yet every outcome was retried", id)
		}
	}
	if outcomes["retried"] < runs-2 {
		t.Errorf("only %d of %d runs retried: %v", outcomes["retried"], runs, outcomes)
	}
}
