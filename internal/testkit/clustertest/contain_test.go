package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/testkit/proctest"
)

// Step containment (issue 24) with real flowd processes: an exec step's processes that
// leave its process group and parentage (setsid, a double fork) stop with the step when
// its run is cancelled, when its owner is frozen past its lease and another node takes
// the run over, and when its flowd is SIGKILLed.

// containFlowd is one build of flowd the containment tests run: the normal one (a PID
// namespace per step, as root), one linked to skip the namespace (the subreaper
// fallback), and the control, linked with containment off (the process group and
// Pdeathsig of before issue 24).
type containFlowd struct {
	name    string
	bin     func(t *testing.T) string
	mode    string // the mode its start-up log must name ("" : a namespace mode)
	control bool
}

var containFlowds = []containFlowd{
	{"default", func(t *testing.T) string { return filepath.Join(Binaries(t), "flowd") }, "", false},
	{"subreaper", func(t *testing.T) string {
		return FlowdLinkedWith(t, "github.com/flowrun/flow/steps.containment=subreaper")
	}, "subreaper", false},
	{"control-containment-off", func(t *testing.T) string {
		return FlowdLinkedWith(t, "github.com/flowrun/flow/steps.containment=off")
	}, "process-group", true},
}

// escapeWorkflow writes the escape script into dir and returns a workflow that runs it.
// The script starts two processes that leave the step's process group and parentage,
// one through setsid and one through a double fork. Each writes its PID to
// EPOCH.NAME.pid, then "EPOCH NANOSECONDS" to dir/marker every 20ms: the side effect
// that must stop with the step. The script writes its epoch to dir/ready once both run.
func escapeWorkflow(t *testing.T, dir string) string {
	t.Helper()
	script := filepath.Join(dir, "escape.sh")
	body := fmt.Sprintf(`D=%s
if [ "$1" = loop ]; then
	read hp _ < /proc/self/stat; echo $hp > $D/$FLOW_EPOCH.$2.pid
	while :; do echo "$FLOW_EPOCH $(date +%%s%%N)" >> $D/marker; sleep 0.02; done
fi
setsid sh $0 loop setsid &
sh -c "sh $0 loop forked & exit 0"
while [ ! -s $D/$FLOW_EPOCH.setsid.pid ] || [ ! -s $D/$FLOW_EPOCH.forked.pid ]; do sleep 0.01; done
echo $FLOW_EPOCH > $D/ready
exec sleep 600
`, dir)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	// Whatever survives (the controls' escapees, any epoch's) is killed at the end.
	t.Cleanup(func() {
		files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return fmt.Sprintf("name: escape\nsteps:\n  - name: pay\n    uses: exec\n    with: {command: [sh, %s]}\n", script)
}

// escaped waits for the first epoch's escaped processes and returns the epoch and their
// PIDs.
func escaped(t *testing.T, dir string) (int64, []int) {
	t.Helper()
	var epoch int64
	WaitFor(t, 60*time.Second, "the step's escaped processes", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "ready"))
		epoch, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return err == nil && epoch > 0
	})
	var pids []int
	for _, name := range []string{"setsid", "forked"} {
		b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("%d.%s.pid", epoch, name)))
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s's PID: %q", name, b)
		}
		pids = append(pids, pid)
	}
	return epoch, pids
}

// lastMark is the newest time epoch's processes wrote to the marker (Unix ns; 0: none).
func lastMark(dir string, epoch int64) int64 {
	b, _ := os.ReadFile(filepath.Join(dir, "marker"))
	var last int64
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || f[0] != strconv.FormatInt(epoch, 10) {
			continue
		}
		if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n > last {
			last = n
		}
	}
	return last
}

// checkEnded asserts that epoch's escaped processes die within wait and that none of
// them wrote the marker after bound; the control asserts the damage instead: a marker
// written after bound (polled with a deadline: nothing signals it).
func checkEnded(t *testing.T, v containFlowd, dir string, epoch int64, pids []int, bound time.Time, wait time.Duration) {
	t.Helper()
	if v.control {
		WaitFor(t, 10*time.Second, "an escaped process to act after the stop (the control's damage)", func() bool { return lastMark(dir, epoch) > bound.UnixNano() })
		t.Logf("control: epoch %d's escaped processes still act %s after the bound", epoch, time.Duration(lastMark(dir, epoch)-bound.UnixNano()).Round(time.Millisecond))
		return
	}
	for _, pid := range pids {
		WaitFor(t, wait, "escaped process "+strconv.Itoa(pid)+" to die", func() bool { return !proctest.Alive(pid) })
	}
	last := lastMark(dir, epoch)
	if last == 0 {
		t.Fatal("no marker at all: the escaped processes never acted, so the test shows nothing")
	}
	if last > bound.UnixNano() {
		t.Fatalf("an escaped process of epoch %d acted %s after the bound", epoch, time.Duration(last-bound.UnixNano()))
	}
	t.Logf("epoch %d's last marker came %s before the bound", epoch, time.Duration(bound.UnixNano()-last).Round(time.Millisecond))
}

// startContainFlowd starts one flowd of build v on url and checks its start-up log
// names the containment mode it has.
func startContainFlowd(t *testing.T, v containFlowd, url, name string) *Proc {
	t.Helper()
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "flowd.log"))
	if err != nil {
		t.Fatal(err)
	}
	node := &Proc{Name: name, log: logf, args: []string{v.bin(t), "--node-id", name, "--nats-url", url,
		"--data-dir", filepath.Join(dir, "data"), "--http", "off", "--log-format", "json", "--lease-ttl", "1s"}}
	node.args = append(node.args, stepsAsTestUser()...) // its steps write the test's own files
	node.start(t)
	t.Cleanup(node.Kill)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s:\n%s", name, tail(LogOf(node)))
		}
	})
	WaitFor(t, 60*time.Second, name+"'s containment line", func() bool { return strings.Contains(LogOf(node), `"step containment`) || !node.Alive() })
	mode := containmentOf(LogOf(node))
	switch {
	case v.mode != "" && mode != v.mode:
		t.Fatalf("%s logs containment %q; want %q", name, mode, v.mode)
	case v.mode == "" && mode != "pid-namespace" && mode != "user-pid-namespace":
		t.Fatalf("%s logs containment %q; want a PID namespace on this machine (FACTS.md)", name, mode)
	}
	return node
}

// containmentOf reads the mode from flowd's start-up line "step containment".
func containmentOf(log string) string {
	for _, l := range strings.Split(log, "\n") {
		var line struct{ Msg, Mode string }
		if json.Unmarshal([]byte(l), &line) == nil && strings.HasPrefix(line.Msg, "step containment") {
			return line.Mode
		}
	}
	return ""
}

// startEscape applies and starts the escape workflow and waits for its processes.
func startEscape(t *testing.T, cl *client.Client, dir string) (string, int64, []int) {
	t.Helper()
	WaitFor(t, 30*time.Second, "a leader", func() bool {
		var st client.ClusterStatus
		return call(t, cl, "cluster.status", client.Request{}, &st) == nil && st.Leader != ""
	})
	if err := call(t, cl, "workflow.apply", client.Request{File: "escape.yaml", YAML: escapeWorkflow(t, dir)}, nil); err != nil {
		t.Fatal(err)
	}
	var res map[string]string
	if err := call(t, cl, "run.start", client.Request{Workflow: "escape"}, &res); err != nil {
		t.Fatal(err)
	}
	epoch, pids := escaped(t, dir)
	return res["id"], epoch, pids
}

// Invariant 13, a cancel: `flowctl run cancel` of a run whose step left its process
// group (setsid) and its parent (double fork): both processes are dead within the stop
// grace (TTL/4) and a margin, and act no more. In the control (containment off) the
// process group is killed, and the setsid one goes on.
func TestCancelledRunTakesEscapedProcessesWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts flowd processes")
	}
	for _, v := range containFlowds {
		t.Run(v.name, func(t *testing.T) {
			url := startNATSServer(t)
			startContainFlowd(t, v, url, "node-a")
			dir := t.TempDir()
			id, epoch, pids := startEscape(t, dial(t, &Cluster{URLs: []string{url}}), dir)
			cancelled := time.Now()
			if code, out := flowctl(url, "run", "cancel", id); code != 0 {
				t.Fatalf("flowctl run cancel: exit %d: %s", code, out)
			}
			checkEnded(t, v, dir, epoch, pids, cancelled.Add(2*time.Second), 2*time.Second)
		})
	}
}

// Invariant 13, kill -9: the flowd running the step is SIGKILLed; the escaped processes
// die with it (the init's parent-death signal kills the namespace; a subreaper init
// sees its control pipe close). In the control, Pdeathsig kills only the command.
func TestKilledFlowdTakesEscapedProcessesWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills flowd processes")
	}
	for _, v := range containFlowds {
		t.Run(v.name, func(t *testing.T) {
			url := startNATSServer(t)
			node := startContainFlowd(t, v, url, "node-a")
			dir := t.TempDir()
			_, epoch, pids := startEscape(t, dial(t, &Cluster{URLs: []string{url}}), dir)
			killed := time.Now()
			node.Kill()
			checkEnded(t, v, dir, epoch, pids, killed.Add(time.Second), time.Second)
		})
	}
}

// Invariant 8, a frozen owner: the flowd running the step is SIGSTOPped (its kill switch
// cannot fire, its steps' processes go on), its lease lapses and another node takes the
// run over with a new epoch. The step's init holds the lease's trust deadline and stops
// the tree when it passes unrenewed, before the lease can lapse: no process of the old
// epoch acts after the new epoch began. In the controls the old epoch's escaped processes
// go on after the takeover, beside the new epoch's: without containment, and with
// containment but no trust deadline (steps.noTrustDeadline: that guard alone off).
func TestFrozenOwnersStepsStopBeforeTheTakeover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and freezes flowd processes")
	}
	noDeadline := containFlowd{"control-no-trust-deadline", func(t *testing.T) string {
		return FlowdLinkedWith(t, "github.com/flowrun/flow/steps.noTrustDeadline=1")
	}, "", true}
	for _, v := range append(append([]containFlowd{}, containFlowds...), noDeadline) {
		t.Run(v.name, func(t *testing.T) {
			url := startNATSServer(t)
			c := &Cluster{URLs: []string{url}}
			a := startContainFlowd(t, v, url, "node-a")
			dir := t.TempDir()
			cl := dial(t, c)
			id, epoch, pids := startEscape(t, cl, dir)
			startContainFlowd(t, v, url, "node-b")
			WaitFor(t, 30*time.Second, "node-b in the cluster", func() bool {
				var st client.ClusterStatus
				return call(t, cl, "cluster.status", client.Request{}, &st) == nil && len(st.Nodes) == 2
			})
			a.Stop()
			// The new epoch's begin is the assign written for it (the epoch is the assign's
			// sequence; history times have nanoseconds). Requests the frozen node would answer time out: each call is
			// short, and polled.
			var takeover time.Time
			WaitFor(t, 60*time.Second, "node-b to take the run over", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				var events []client.Event
				if callCtx(ctx, cl, "run.history", client.Request{ID: id}, &events) != nil {
					return false
				}
				for _, e := range events {
					if e.Kind == "assign" && e.Seq > uint64(epoch) {
						at, err := time.Parse(time.RFC3339Nano, e.At)
						takeover = at
						return err == nil
					}
				}
				return false
			})
			checkEnded(t, v, dir, epoch, pids, takeover, 2*time.Second)
		})
	}
}
