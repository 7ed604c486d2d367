package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
)

// A failure handler runs once per failure across its owner's SIGKILL (issue 27): node-a
// alone runs a run that fails; the applier starts its on_failure handler run (an ID
// derived from the run and the event, on every node alike); node-a runs the handler's
// step, which writes a marker and waits on a gate; node-a is SIGKILLed; node-b, started
// after, takes the handler run over once its lease lapses, and it ends. One handler run
// (its step may run twice: an owner's crash mid-step is at-least-once for the step,
// once for the run), and the failed run stays failed.
func TestFailureHandlerOnceAcrossAnOwnerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a flowd process")
	}
	t.Parallel()
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	dir := t.TempDir()
	marker, gate := filepath.Join(dir, "told"), filepath.Join(dir, "gate")
	a := StartFlowd(t, c, "node-a", append([]string{"--lease-ttl", "1s"}, stepsAsTestUser()...)...) // its steps write the test's files
	cl := dial(t, c)
	yaml := fmt.Sprintf(`name: nightly
steps:
  - {name: pay, uses: exec, with: {command: [sh, -c, "exit 3"]}}
on_failure:
  - name: tell
    uses: exec
    with: {command: [sh, -c, "echo '{{ run.id }} {{ run.failed_step }}' >> %s; while [ ! -f %s ]; do sleep 0.05; done"]}
`, marker, gate)
	WaitFor(t, 30*time.Second, "the workflow applied", func() bool {
		return call(t, cl, "workflow.apply", client.Request{File: "w.yaml", YAML: yaml}, nil) == nil
	})
	if err := call(t, cl, "run.start", client.Request{Workflow: "nightly", ID: "n-1"}, nil); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 30*time.Second, "the handler's step started on node-a", func() bool {
		b, _ := os.ReadFile(marker)
		return strings.Contains(string(b), "n-1 pay")
	})
	a.Kill()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	StartFlowd(t, c, "node-b", append([]string{"--lease-ttl", "1s"}, stepsAsTestUser()...)...)
	cl = dial(t, c)
	WaitFor(t, 60*time.Second, "the handler run ended on node-b", func() bool {
		var r client.Run
		return call(t, cl, "run.get", client.Request{ID: "n-1.on-failure.0"}, &r) == nil && r.Status == "succeeded"
	})
	var runs []client.Run
	if err := call(t, cl, "run.list", client.Request{Workflow: "nightly", Limit: 100}, &runs); err != nil {
		t.Fatal(err)
	}
	var handlers []string
	for _, r := range runs {
		if r.Trigger == "handler" {
			handlers = append(handlers, r.ID)
		}
		if r.ID == "n-1" && r.Status != "failed" {
			t.Fatalf("the failed run is %s after its handler", r.Status)
		}
	}
	if len(handlers) != 1 {
		t.Fatalf("handler runs %v: want one", handlers)
	}
}
