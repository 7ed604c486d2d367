package engine

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/natsnode"
)

const finWorkflow = "name: fin\nsteps:\n  - {name: prep, uses: noop}\n  - {name: transfer, uses: noop, needs: [prep], runs_on: [finance]}\n"

// runs_on on two engines over one NATS server: with only node-a (no labels) up, a run of
// fin waits, shown waiting of kind label for finance, counted by the metric, and
// unclaimed; when node-b starts with --labels finance, the run succeeds on node-b.
func TestRunsOnWaitsForALabelledNode(t *testing.T) {
	srv, err := natsnode.Start(natsnode.Config{DataDir: filepath.Join(t.TempDir(), "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	a := startEngine(t, func(c *Config) { c.NATSURL = srv.ClientURL() })
	if err := a.Ops().WaitClusterVersion(ctxT(t, 30*time.Second), 3); err != nil {
		t.Fatal(err)
	}
	apply(t, a, finWorkflow)
	id, err := a.StartRun(ctxT(t, 10*time.Second), "fin", nil, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var r client.Run
	pollUntil(t, 20*time.Second, "the run shown waiting for finance", func() bool {
		r, err = a.API().Run(id)
		return err == nil && r.Waiting != nil && r.Waiting.Kind == client.WaitLabel
	})
	if r.Status != "waiting" || r.Waiting.Label != "finance" || len(r.Waiting.Labels) != 1 || r.Owner != "" {
		t.Fatalf("run %+v, waiting %+v", r, r.Waiting)
	}
	if n := a.Metrics(ctxT(t, 5*time.Second)).WaitingForLabel["finance"]; n != 1 {
		t.Fatalf("flow_runs_waiting_for_label{finance} = %d; want 1", n)
	}
	page, err := a.API().Runs(client.ListOptions{Workflow: "fin"})
	if err != nil || len(page.Runs) != 1 || page.Runs[0].Waiting == nil || page.Runs[0].Waiting.Kind != client.WaitLabel {
		t.Fatalf("run list: %+v %v", page, err)
	}
	b := startEngine(t, func(c *Config) { c.NodeID = "node-b"; c.NATSURL = srv.ClientURL(); c.Labels = []string{"finance"} })
	if _, err := b.WaitRun(ctxT(t, 30*time.Second), id); err != nil {
		t.Fatal(err)
	}
	v, err := b.Run(id) // node-b's state, where WaitRun saw it end (node-a may not have applied it yet)
	if err != nil || v.Run.Status != "succeeded" {
		t.Fatalf("run %+v %v", v, err)
	}
	for _, ep := range v.Run.Epochs {
		if ep.Owner != "node-b" {
			t.Fatalf("epoch %d owned by %s, a node without the finance label", ep.Epoch, ep.Owner)
		}
	}
}

// A workflow with runs_on is refused below cluster version 3 (a node of an older release
// would ignore it), with the fix named, and nothing applied.
func TestRunsOnNeedsClusterVersion3(t *testing.T) {
	e := startEngine(t, func(c *Config) { c.HoldClusterVersion = true })
	pollUntil(t, 20*time.Second, "a look of the leader at the roster", func() bool { return e.gatePasses.Load() >= 1 })
	_, err := e.ApplyWorkflow(ctxT(t, 10*time.Second), "fin.yaml", []byte(finWorkflow))
	if err == nil || !strings.Contains(err.Error(), "runs_on needs cluster version 3") || !strings.Contains(err.Error(), "cluster status") {
		t.Fatalf("apply at version 1: %v", err)
	}
	if _, err := e.Workflow("fin", 0); err == nil {
		t.Fatal("the refused workflow was applied")
	}
}

// Config.Labels are checked like the flag.
func TestConfigLabelsAreChecked(t *testing.T) {
	for _, labels := range [][]string{{"Finance"}, {""}, {"a b"}} {
		if err := (Config{NodeID: "n", Labels: labels}).Validate(); err == nil || !strings.Contains(err.Error(), "Config.Labels") {
			t.Errorf("labels %q: %v", labels, err)
		}
	}
}
