package clustertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowrun/flow/internal/api"
)

// waitJetStream waits until the cluster answers JetStream requests.
func waitJetStream(t *testing.T, c *Cluster) {
	WaitFor(t, 30*time.Second, "the NATS cluster", func() bool {
		nc, err := nats.Connect(c.URL(), nats.Timeout(time.Second))
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

func client(t *testing.T, c *Cluster) *api.Client {
	cl, err := api.Dial(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func call(t *testing.T, cl *api.Client, op string, req api.Req, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cl.Call(ctx, op, req, out)
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
	cl := client(t, c)
	defer func() {
		if t.Failed() {
			t.Logf("node-a:\n%s\nnode-b:\n%s", tail(LogOf(na)), tail(LogOf(nb)))
		}
	}()
	WaitFor(t, 30*time.Second, "two nodes and a leader", func() bool {
		var st api.ClusterStatus
		return call(t, cl, "cluster.status", api.Req{}, &st) == nil && st.Leader != "" && len(st.Nodes) == 2
	})
	yaml := "name: steady\nsteps:\n"
	for i := 1; i <= 5; i++ {
		yaml += fmt.Sprintf("  - name: s%d\n    uses: sleep\n    with: {duration: 150ms}\n", i)
		if i > 1 {
			yaml += fmt.Sprintf("    needs: [s%d]\n", i-1)
		}
	}
	if err := call(t, cl, "workflow.apply", api.Req{File: "steady.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 10; i++ {
		var res map[string]string
		if err := call(t, cl, "run.start", api.Req{Workflow: "steady"}, &res); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res["id"])
	}
	WaitFor(t, 20*time.Second, "runs under way", func() bool {
		var r api.Run
		return call(t, cl, "run.get", api.Req{ID: ids[0]}, &r) == nil && r.Status == "running"
	})
	c.Servers[1].Kill()
	killed := time.Now()
	// One deadline for all: on two cores the streams' new leaders take from seconds to
	// about a minute (measured 6-122 s for the whole test, docs/failure-modes.md).
	deadline := 4 * time.Minute
	for _, id := range ids {
		WaitFor(t, max(deadline-time.Since(killed), time.Second), "run "+id+" to finish", func() bool {
			var r api.Run
			return call(t, cl, "run.get", api.Req{ID: id}, &r) == nil && (r.Status == "succeeded" || r.Status == "failed" || r.Status == "dead_lettered")
		})
		var r api.Run
		if err := call(t, cl, "run.get", api.Req{ID: id}, &r); err != nil || r.Status != "succeeded" {
			t.Fatalf("run %s: %v %+v", id, err, r)
		}
		var v api.Verification
		if err := call(t, cl, "run.verify", api.Req{ID: id}, &v); err != nil || !v.OK {
			t.Fatalf("verify %s: %v %+v", id, err, v)
		}
	}
	t.Logf("every run finished and verified %s after the NATS server was killed", time.Since(killed).Round(100*time.Millisecond))
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
