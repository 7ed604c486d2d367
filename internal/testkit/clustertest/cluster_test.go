package clustertest

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/client"
)

// waitJetStream waits until the cluster answers JetStream requests (of a connection
// made with opts: credentials, TLS).
func waitJetStream(t *testing.T, c *Cluster, opts ...nats.Option) {
	WaitFor(t, 60*time.Second, "the NATS cluster's JetStream", func() bool {
		nc, err := nats.Connect(c.URL(), append(opts, nats.Timeout(time.Second))...)
		if err != nil {
			return false
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
}

func dial(t *testing.T, c *Cluster) *client.Client {
	cl, err := client.Dial(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// call is one API operation by its name, through the public client's methods; out, when
// not nil, points at the operation's result type.
func call(t *testing.T, cl *client.Client, op string, req client.Request, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return callCtx(ctx, cl, op, req, out)
}

func callCtx(ctx context.Context, cl *client.Client, op string, req client.Request, out any) error {
	set := func(v any, err error) error {
		if err == nil && out != nil {
			reflect.ValueOf(out).Elem().Set(reflect.ValueOf(v))
		}
		return err
	}
	switch op {
	case "cluster.status":
		return set(cl.ClusterStatus(ctx))
	case "workflow.apply":
		return set(cl.ApplyWorkflow(ctx, req.File, []byte(req.YAML)))
	case "run.start":
		id, err := cl.StartRun(ctx, req.Workflow, client.StartOptions{ID: req.ID, Inputs: req.Inputs})
		if r, ok := out.(*client.Run); ok { // the answer holds the ID alone
			r.ID = id
			return err
		}
		return set(map[string]string{"id": id}, err)
	case "run.get":
		return set(cl.Run(ctx, req.ID))
	case "run.wait":
		d, _ := time.ParseDuration(req.Wait)
		return set(cl.WaitRun(ctx, req.ID, d))
	case "run.list":
		return set(cl.Runs(ctx, client.ListOptions{Workflow: req.Workflow, Status: req.Status, Limit: req.Limit, After: req.After}))
	case "run.verify":
		return set(cl.Verify(ctx, req.ID))
	case "run.history":
		return set(cl.History(ctx, req.ID))
	case "run.logs":
		return set(cl.RunLogs(ctx, req.ID, client.LogOptions{Step: req.Step, Item: req.Item, Attempt: req.Attempt, After: req.After}))
	case "cron.backfill":
		return set(cl.Backfill(ctx, req.Workflow, client.BackfillOptions{From: req.From, To: req.To, OnlyMissed: req.OnlyMissed,
			Order: req.Order, MaxParallel: req.MaxParallel, DryRun: req.DryRun}))
	}
	return fmt.Errorf("call: no client method for %s", op)
}

// NATS node loss: two flowd nodes on a three-server JetStream cluster; one server is
// SIGKILLed while runs are going: every run finishes, every step committed once.
func TestNATSNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server NATS cluster and kills one")
	}
	c := StartNATS(t, 3)
	waitJetStream(t, c)
	na := StartFlowd(t, c, "node-a", "--lease-ttl", "2s")
	nb := StartFlowd(t, c, "node-b", "--lease-ttl", "2s")
	cl := dial(t, c)
	defer func() {
		if t.Failed() {
			t.Logf("node-a:\n%s\nnode-b:\n%s", tail(LogOf(na)), tail(LogOf(nb)))
		}
	}()
	WaitFor(t, 30*time.Second, "two nodes and a leader", func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Leader != "" && len(st.Nodes) == 2
	})
	yaml := "name: steady\nsteps:\n"
	for i := 1; i <= 5; i++ {
		yaml += fmt.Sprintf("  - name: s%d\n    uses: sleep\n    with: {duration: 150ms}\n", i)
		if i > 1 {
			yaml += fmt.Sprintf("    needs: [s%d]\n", i-1)
		}
	}
	if err := call(t, cl, "workflow.apply", client.Request{File: "steady.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 10; i++ {
		var res map[string]string
		if err := call(t, cl, "run.start", client.Request{Workflow: "steady"}, &res); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res["id"])
	}
	WaitFor(t, 20*time.Second, "runs under way", func() bool {
		var r client.Run
		return call(t, cl, "run.get", client.Request{ID: ids[0]}, &r) == nil && r.Status == "running"
	})
	c.Servers[1].Kill()
	killed := time.Now()
	// One deadline for all: on two cores the streams' new leaders take from seconds to
	// about a minute (measured 6-122 s for the whole test, docs/failure-modes.md).
	deadline := 4 * time.Minute
	for _, id := range ids {
		ended := func() bool {
			var r client.Run
			return call(t, cl, "run.get", client.Request{ID: id}, &r) == nil && (r.Status == "succeeded" || r.Status == "failed" || r.Status == "dead_lettered")
		}
		for !ended() {
			if time.Since(killed) > deadline {
				// Seen once in a fresh-clone CI run (a run started just before the kill,
				// never run, nothing about it at info level): say where it stands.
				var r client.Run
				err := call(t, cl, "run.get", client.Request{ID: id}, &r)
				t.Fatalf("run %s has not ended %s after the kill: %v; status %q epoch %d owner %q epochs %+v; cluster %+v\nnode-a on it:\n%s\nnode-b on it:\n%s",
					id, deadline, err, r.Status, r.Epoch, r.Owner, r.Epochs, statusOf(t, cl), linesWith(LogOf(na), id), linesWith(LogOf(nb), id))
			}
			time.Sleep(100 * time.Millisecond) // polling the cluster's answer, with the deadline above
		}
		var r client.Run
		if err := call(t, cl, "run.get", client.Request{ID: id}, &r); err != nil || r.Status != "succeeded" {
			t.Fatalf("run %s: %v %+v", id, err, r)
		}
		var v client.Verification
		if err := call(t, cl, "run.verify", client.Request{ID: id}, &v); err != nil || !v.OK {
			t.Fatalf("verify %s: %v %+v", id, err, v)
		}
	}
	t.Logf("every run finished and verified %s after the NATS server was killed", time.Since(killed).Round(100*time.Millisecond))
}

// statusOf is cluster status through cl (zero when the call fails: a poll asks again).
func statusOf(t *testing.T, cl *client.Client) client.ClusterStatus {
	var st client.ClusterStatus
	_ = call(t, cl, "cluster.status", client.Request{}, &st)
	return st
}

// logsOnFailure logs each node's log (its important lines) at the test's end if it failed.
func logsOnFailure(t *testing.T, names []string, nodes map[string]*Proc) {
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range names {
				t.Logf("%s:\n%s", n, tail(LogOf(nodes[n])))
			}
		}
	})
}

// linesWith are the lines of a log that mention s, debug ones included.
func linesWith(log, s string) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func tail(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.Contains(l, `"level":"DEBUG"`) {
			keep = append(keep, l)
		}
	}
	s = strings.Join(keep, "\n")
	if len(s) > 6000 {
		return s[len(s)-6000:]
	}
	return s
}
