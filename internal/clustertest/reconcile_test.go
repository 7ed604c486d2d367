package clustertest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/api"
)

// Reconcile: the whole cluster (three flowd nodes) is SIGKILLed in the middle of runs
// and started again: every run finishes, every step is committed once, and a step's side
// effect repeats only if that step was in flight at the kill. Invariant 6 of DESIGN.md.
func TestWholeClusterRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("kills flowd processes")
	}
	url := startNATSServer(t)
	c := &Cluster{URLs: []string{url}}
	dir := t.TempDir()
	effects := filepath.Join(dir, "effects")
	var names []string
	nodes := map[string]*Proc{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		nodes[n] = StartFlowd(t, c, n, "--lease-ttl", "1s")
		names = append(names, n)
	}
	cl := client(t, c)
	WaitFor(t, 30*time.Second, "three nodes", func() bool {
		var st api.ClusterStatus
		return call(t, cl, "cluster.status", api.Req{}, &st) == nil && st.Leader != "" && len(st.Nodes) == 3
	})
	yaml := "name: work\nmax_epochs: 10\nsteps:\n"
	for i := 1; i <= 4; i++ {
		yaml += fmt.Sprintf("  - name: s%d\n    uses: exec\n    with: {command: [sh, -c, \"echo $FLOW_RUN_ID s%d >> %s; sleep 0.3; echo '{}'\"]}\n", i, i, effects)
		if i > 1 {
			yaml += fmt.Sprintf("    needs: [s%d]\n", i-1)
		}
	}
	if err := call(t, cl, "workflow.apply", api.Req{File: "work.yaml", YAML: yaml}, nil); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := 0; i < 8; i++ {
		var res map[string]string
		if err := call(t, cl, "run.start", api.Req{Workflow: "work"}, &res); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res["id"])
	}
	WaitFor(t, 30*time.Second, "runs half way", func() bool {
		data, _ := os.ReadFile(effects)
		return strings.Count(string(data), "\n") >= 12
	})
	for _, n := range names {
		nodes[n].Kill()
	}
	for _, n := range names {
		nodes[n].Restart(t)
	}
	for _, id := range ids {
		WaitFor(t, 60*time.Second, "run "+id, func() bool {
			var r api.Run
			return call(t, cl, "run.get", api.Req{ID: id}, &r) == nil && r.Status == "succeeded"
		})
		var v api.Verification
		if err := call(t, cl, "run.verify", api.Req{ID: id}, &v); err != nil || !v.OK {
			t.Fatalf("verify %s: %v %+v", id, err, v)
		}
	}
	data, _ := os.ReadFile(effects)
	count := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		count[l]++
	}
	repeats := 0
	for l, n := range count {
		if n > 2 {
			t.Fatalf("%q ran %d times", l, n)
		}
		if n == 2 {
			repeats++
		}
	}
	if len(count) != len(ids)*4 {
		t.Fatalf("%d distinct step executions, want %d", len(count), len(ids)*4)
	}
	// Only the steps in flight at the kill may repeat: at most one per run.
	if repeats > len(ids) {
		t.Fatalf("%d steps ran twice; only those in flight at the kill (at most one per run) may", repeats)
	}
	t.Logf("8 runs x 4 steps across a whole-cluster kill: %d steps in flight at the kill ran again", repeats)
}
