package clustertest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// A child is started once across its parent owner's crash (issue 26): node-a runs the
// parent alone and SIGKILLs itself right after the child's start is in the log, before
// the parent parks (flowd linked with worker.killAfterChildStart); node-b, started
// after, takes the parent over once its lease lapses and starts the child again: the same
// ID, refused as existing. One child. The control gives each start a new ID
// (worker.randomChildIDs, on both nodes): a second child while the first exists.
func TestChildStartedOnceAcrossAnOwnerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process")
	}
	t.Parallel()
	const pkg = "github.com/flowrun/flow/engine/internal/worker."
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "derived-id", true: "control-random-ids"}[control], func(t *testing.T) {
			killer := FlowdLinkedWith(t, pkg+"killAfterChildStart=1")
			other := filepath.Join(Binaries(t), "flowd")
			if control {
				killer = FlowdLinkedWith(t, pkg+"killAfterChildStart=1", pkg+"randomChildIDs=1")
				other = FlowdLinkedWith(t, pkg+"randomChildIDs=1")
			}
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			dir := t.TempDir()
			node := func(name, bin string) *Proc {
				logf, err := os.Create(filepath.Join(dir, name+".log"))
				if err != nil {
					t.Fatal(err)
				}
				p := &Proc{Name: name, log: logf, args: []string{bin, "--node-id", name, "--nats-url", url, "--data-dir", filepath.Join(dir, name),
					"--http", "off", "--log-format", "json", "--lease-ttl", "1s"}}
				p.start(t)
				t.Cleanup(p.Kill)
				return p
			}
			a := node("node-a", killer)
			cl := dial(t, c)
			for _, yaml := range []string{
				"name: settle\nsteps:\n  - {name: pay, uses: noop}\n",
				"name: parent\nsteps:\n  - {name: c, uses: workflow, with: {workflow: settle}}\n",
			} {
				WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
					return call(t, cl, "workflow.apply", client.Request{File: "w.yaml", YAML: yaml}, nil) == nil
				})
			}
			if err := call(t, cl, "run.start", client.Request{Workflow: "parent", ID: "p-1"}, nil); err != nil {
				t.Fatal(err)
			}
			WaitFor(t, 30*time.Second, "node-a killed itself after the child's start", func() bool { return !a.Alive() })
			node("node-b", other)
			if control {
				// Every start makes a new child (each resumption of the parent too, so the
				// parent never ends): the damage is the second child.
				WaitFor(t, 60*time.Second, "a second child", func() bool {
					var runs []client.Run
					return call(t, cl, "run.list", client.Request{Workflow: "settle", Limit: 100}, &runs) == nil && len(runs) >= 2
				})
				return
			}
			WaitFor(t, 60*time.Second, "the parent ended on node-b", func() bool {
				var r client.Run
				return call(t, cl, "run.get", client.Request{ID: "p-1"}, &r) == nil && r.Status == "succeeded"
			})
			var runs []client.Run
			if err := call(t, cl, "run.list", client.Request{Workflow: "settle", Limit: 100}, &runs); err != nil {
				t.Fatal(err)
			}
			if want := 1; len(runs) != want {
				var ids []string
				for _, r := range runs {
					ids = append(ids, r.ID+" "+r.Status)
				}
				t.Fatalf("%d child runs %v, want %d", len(runs), ids, want)
			}
			if runs[0].ID != "p-1.c" {
				t.Fatalf("child %s, want p-1.c", runs[0].ID)
			}
			t.Logf("%d child run(s): %s", len(runs), runs[0].ID)
		})
	}
}
