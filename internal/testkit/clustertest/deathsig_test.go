package clustertest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/proctest"
)

// flowdWithoutDeathsig builds flowd with step containment and the parent-death signal
// of exec steps switched off at link time (steps.containment and steps.noDeathSignal,
// empty in every other build): the negative control of
// TestKilledFlowdTakesItsStepsWithIt.
func flowdWithoutDeathsig(t *testing.T) string {
	return FlowdLinkedWith(t, "github.com/flowrun/flow/steps.noDeathSignal=1", "github.com/flowrun/flow/steps.containment=off")
}

// Invariant 8, kill -9: a flowd process runs an exec step and is SIGKILLed. The step's
// process dies with it at once (its init gets the parent-death signal and the kernel
// kills the init's PID namespace), before the lease can lapse and a new epoch run the
// step elsewhere; it never does what it would do after its parent's death (here: a
// marker written once its parent, the init, is gone). The control runs a flowd built
// without containment and without the signal: the step is reparented to init, outlives
// flowd and writes the marker — the "two copies at once" of issue 12.
// (TestKilledFlowdTakesEscapedProcessesWithIt does the same for what the step forks.)
func TestKilledFlowdTakesItsStepsWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills flowd")
	}
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "pdeathsig", true: "control-without-pdeathsig"}[control], func(t *testing.T) {
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			bin := filepath.Join(Binaries(t), "flowd")
			if control {
				bin = flowdWithoutDeathsig(t)
			}
			dir := t.TempDir()
			logf, _ := os.Create(filepath.Join(dir, "flowd.log"))
			node := &Proc{Name: "node-a", log: logf, args: []string{bin, "--node-id", "node-a", "--nats-url", url,
				"--data-dir", filepath.Join(dir, "data"), "--http", "off", "--log-format", "json", "--lease-ttl", "1s"}}
			node.args = append(node.args, stepsAsTestUser()...) // its step writes the test's own files
			node.start(t)
			t.Cleanup(node.Kill)
			defer func() {
				if t.Failed() {
					t.Logf("flowd:\n%s", tail(LogOf(node)))
				}
			}()
			cl := dial(t, c)
			WaitFor(t, 30*time.Second, "a leader", func() bool {
				var st client.ClusterStatus
				return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Leader != ""
			})
			pidFile, marker := filepath.Join(dir, "pid"), filepath.Join(dir, "marker")
			// The step waits while its parent (flowd) lives, then acts: what a step of a dead
			// flowd must never do, since another node may be running it by then.
			yaml := fmt.Sprintf("name: orphan\nsteps:\n  - name: pay\n    uses: exec\n    with: {command: [sh, -c, \"read hp _ < /proc/self/stat; echo $hp > %s; while kill -0 $PPID 2>/dev/null; do sleep 0.02; done; touch %s\"]}\n", pidFile, marker)
			if err := call(t, cl, "workflow.apply", client.Request{File: "orphan.yaml", YAML: yaml}, nil); err != nil {
				t.Fatal(err)
			}
			if err := call(t, cl, "run.start", client.Request{Workflow: "orphan"}, nil); err != nil {
				t.Fatal(err)
			}
			var pid int
			WaitFor(t, 30*time.Second, "the step's process", func() bool {
				b, err := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
				return err == nil && bytes.HasSuffix(b, []byte("\n")) && pid > 0
			})
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // the control's survivor
			killed := time.Now()
			node.Kill()
			if control {
				WaitFor(t, 10*time.Second, "the orphaned step to act", func() bool { _, err := os.Stat(marker); return err == nil })
				return
			}
			WaitFor(t, 2*time.Second, "the step's process to die with flowd", func() bool { return !proctest.Alive(pid) })
			t.Logf("the step's process was gone %s after the SIGKILL of flowd", time.Since(killed).Round(time.Millisecond))
			// It acts only after seeing flowd gone, which is after the kernel sent it SIGKILL.
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the step of a killed flowd acted")
			}
		})
	}
}
