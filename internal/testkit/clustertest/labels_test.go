package clustertest

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

const financeWorkflow = `name: fin
steps:
  - {name: prep, uses: sleep, with: {duration: 50ms}}
  - {name: transfer, uses: sleep, needs: [prep], with: {duration: 200ms}, runs_on: [finance]}
`

// A workflow with a runs_on: [finance] step on a cluster of real flowd processes: with
// only unlabelled nodes up, its runs wait (shown waiting, kind label, for finance), and
// none is claimed; when a node started with --labels finance joins, every run succeeds,
// and every claim and every commit of every run is that node's. A second batch started
// while it is up goes to it alone too, though the unlabelled nodes have free workers.
//
// The control is flowd linked with worker.labelsOff on every node: the leader still
// waits for a finance node before it assigns, but then the unlabelled nodes' workers
// take tasks too, and a run's steps run on a node without the label.
func TestRunsOnRoutesRunsToLabelledNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	t.Parallel()
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "guard", true: "control-labels-off"}[control], func(t *testing.T) {
			bin := filepath.Join(Binaries(t), "flowd")
			if control {
				bin = FlowdLinkedWith(t, "github.com/flowrun/flow/engine/internal/worker.labelsOff=1")
			}
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			names := []string{"node-a", "node-b", "node-fin"}
			nodes := map[string]*Proc{}
			for _, name := range names[:2] {
				nodes[name] = startFlowdBin(t, c, name, bin, append([]string{"--lease-ttl", "2s"}, stepsAsTestUser()...)...)
			}
			logsOnFailure(t, names, nodes)
			cl := dial(t, c)
			WaitFor(t, 60*time.Second, "a leader, two nodes, cluster version 3", func() bool {
				st := statusOf(t, cl)
				return st.Leader != "" && len(st.Nodes) == 2 && st.ClusterVersion >= 3
			})
			if err := call(t, cl, "workflow.apply", client.Request{File: "fin.yaml", YAML: financeWorkflow}, nil); err != nil {
				t.Fatal(err)
			}
			start := func(from, n int) []string {
				var ids []string
				for i := from; i < from+n; i++ {
					id := fmt.Sprintf("fin-%02d", i)
					if err := call(t, cl, "run.start", client.Request{Workflow: "fin", ID: id}, nil); err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				return ids
			}
			ids := start(0, 6)
			WaitFor(t, 30*time.Second, "every run waiting for a finance node", func() bool {
				for _, id := range ids {
					var r client.Run
					if call(t, cl, "run.get", client.Request{ID: id}, &r) != nil || r.Status != "waiting" || r.Waiting == nil ||
						r.Waiting.Kind != client.WaitLabel || r.Waiting.Label != "finance" {
						return false
					}
				}
				return true
			})
			// Waiting, not failing, and not claimed, after the leader assigned, and the
			// unlabelled workers ran, a run started after them that any node may take.
			if err := call(t, cl, "workflow.apply", client.Request{File: "any.yaml", YAML: "name: any\nsteps:\n  - {name: a, uses: sleep, with: {duration: 50ms}}\n"}, nil); err != nil {
				t.Fatal(err)
			}
			if err := call(t, cl, "run.start", client.Request{Workflow: "any", ID: "any-1"}, nil); err != nil {
				t.Fatal(err)
			}
			WaitFor(t, 30*time.Second, "a run without runs_on to succeed meanwhile", func() bool {
				var r client.Run
				return call(t, cl, "run.get", client.Request{ID: "any-1"}, &r) == nil && r.Status == "succeeded"
			})
			for _, id := range ids {
				var r client.Run
				if err := call(t, cl, "run.get", client.Request{ID: id}, &r); err != nil || r.Status != "waiting" || r.Owner != "" || len(r.Epochs) != 0 {
					t.Fatalf("run %s without a finance node: status %s, owner %q, epochs %v, err %v", id, r.Status, r.Owner, r.Epochs, err)
				}
			}
			nodes["node-fin"] = startFlowdBin(t, c, "node-fin", bin, append([]string{"--lease-ttl", "2s", "--labels", "finance"}, stepsAsTestUser()...)...)
			ids = append(ids, start(6, 6)...)
			ended := func(ids []string) {
				WaitFor(t, 90*time.Second, "every run ended", func() bool {
					for _, id := range ids {
						var r client.Run
						if call(t, cl, "run.get", client.Request{ID: id}, &r) != nil || (r.Status != "succeeded" && r.Status != "failed") {
							return false
						}
					}
					return true
				})
			}
			ended(ids)
			elsewhere := 0
			for _, id := range ids {
				var r client.Run
				var history []client.Event
				if err := call(t, cl, "run.get", client.Request{ID: id}, &r); err != nil || r.Status != "succeeded" {
					t.Fatalf("run %s: %s %s %v", id, r.Status, r.Error, err)
				}
				if err := call(t, cl, "run.history", client.Request{ID: id}, &history); err != nil {
					t.Fatal(err)
				}
				for _, ev := range history {
					if (ev.Kind == "claim" || ev.Kind == "commit") && ev.Owner != "node-fin" {
						elsewhere++
						if !control {
							t.Errorf("run %s: %s of %s by %s, a node without the finance label", id, ev.Kind, ev.Step, ev.Owner)
						}
					}
				}
			}
			if control {
				if elsewhere == 0 {
					t.Fatal("control: with the workers' label check off, every run still ran on the finance node")
				}
				t.Logf("control: %d claims and commits on nodes without the finance label", elsewhere)
			}
		})
	}
}
