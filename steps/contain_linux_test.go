package steps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/within"
)

// escapeScript writes a script into dir that starts two processes that leave the
// command's process group and parentage: one through setsid, one through a double fork
// (its parent exits at once, so it is orphaned). Each writes a timestamp (Unix
// nanoseconds) to dir/marker, its PID to NAME.pid, then a timestamp every 20ms: the side
// effect that must stop with the step. The script writes dir/ready once both PIDs are
// written, then runs then. The first marker comes before the PID so that a command that
// exits at once cannot be stopped before anything acted (the "no marker at all" that a
// loaded machine showed once in five runs).
func escapeScript(t *testing.T, dir, then string) string {
	t.Helper()
	script := filepath.Join(dir, "escape.sh")
	body := fmt.Sprintf(`D=%s
if [ "$1" = loop ]; then
	date +%%s%%N >> $D/marker
	%s > $D/$2.pid
	while :; do sleep 0.02; date +%%s%%N >> $D/marker; done
fi
setsid sh $0 loop setsid &
sh -c "sh $0 loop forked & exit 0"
while [ ! -s $D/setsid.pid ] || [ ! -s $D/forked.pid ]; do sleep 0.01; done
echo ready > $D/ready
%s
`, dir, hostPid, then)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// escapees waits for the script's two processes and returns their PIDs; the test's
// cleanup kills them (the controls' survivors).
func escapees(t *testing.T, dir string) []int {
	t.Helper()
	waitUntil(t, 10*time.Second, "the escaped processes to start", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
	pids := []int{readPid(t, filepath.Join(dir, "setsid.pid")), readPid(t, filepath.Join(dir, "forked.pid"))}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return pids
}

// lastMarker is the newest timestamp in dir/marker (0 if none).
func lastMarker(dir string) int64 {
	b, _ := os.ReadFile(filepath.Join(dir, "marker"))
	var last int64
	for _, l := range strings.Split(string(b), "\n") {
		if n, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64); err == nil && n > last {
			last = n
		}
	}
	return last
}

// checkStopped asserts the escaped processes are dead within margin of stopped and
// that no marker was written after stopped+margin; the control asserts the damage
// instead: a marker written after it (polled with a deadline: nothing signals it).
func checkStopped(t *testing.T, control bool, dir string, pids []int, stopped time.Time, margin time.Duration) {
	t.Helper()
	after := stopped.Add(margin).UnixNano()
	if control {
		waitUntil(t, 10*time.Second, "an escaped process to act after the stop (the control's damage)", func() bool { return lastMarker(dir) > after })
		return
	}
	for _, pid := range pids {
		waitUntil(t, max(time.Until(stopped.Add(margin)), 10*time.Millisecond), "escaped process "+strconv.Itoa(pid)+" to die", func() bool { return !alive(pid) })
	}
	if last := lastMarker(dir); last > after {
		t.Fatalf("an escaped process wrote its marker %s after the stop", time.Duration(last-stopped.UnixNano()))
	}
	if lastMarker(dir) == 0 {
		t.Fatal("no marker at all: the escaped processes never acted, so the test shows nothing")
	}
}

// modes are the containment modes tested here: the namespace this machine gives (if
// any), the user namespace's too where root can make one (the mode of a flowd that is
// not root; clustertest's TestStepsCannotReadFlowdsEnvironment runs one), the
// subreaper fallback, and the control without containment.
func modes(t *testing.T) []Mode {
	var ms []Mode
	if c := Containment(); c == ModePIDNamespace || c == ModeUserPIDNamespace {
		ms = append(ms, c)
		if c == ModePIDNamespace && probeMode(ModeUserPIDNamespace) == nil {
			ms = append(ms, ModeUserPIDNamespace)
		}
	} else {
		t.Logf("no PID namespace here: %s; only the subreaper mode is tested", ContainmentNote())
	}
	return append(ms, ModeSubreaper, ModeProcessGroup)
}

func modeName(m Mode) string {
	if m == ModeProcessGroup {
		return "control-" + string(m)
	}
	return string(m)
}

// Invariant 13: processes that leave the command's process group and parentage (setsid;
// a double fork, orphaned) stop with the step, in each containment mode: when the step
// is stopped (its context ends: a cancel, a timeout, a lost lease) and when the command
// exits and leaves them running (then they are dead by the time the step returns). The
// control runs without containment (the process group and Pdeathsig of before issue
// 24): they go on writing their marker long after.
func TestContainmentStopsEscapedProcesses(t *testing.T) {
	for _, m := range modes(t) {
		for _, event := range []string{"cancel", "command-exits"} {
			t.Run(modeName(m)+"/"+event, func(t *testing.T) {
				dir := t.TempDir()
				then := "exec sleep 600"
				if event == "command-exits" {
					then = "exit 0"
				}
				script := escapeScript(t, dir, then)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				go func() {
					_, err := Exec{MaxOutput: 1 << 10, KillGrace: 200 * time.Millisecond, mode: m}.Run(ctx, in(map[string]any{"command": list("sh", script)}))
					done <- err
				}()
				pids := escapees(t, dir)
				var stopped time.Time
				if event == "cancel" {
					stopped = time.Now()
					cancel()
					if err := within.Recv(t, 30*time.Second, done, "the cancelled step"); !errors.Is(err, context.Canceled) {
						t.Fatalf("step: %v; want it cancelled", err)
					}
				} else {
					if err := within.Recv(t, 30*time.Second, done, "the step whose command exits"); err != nil {
						t.Fatalf("step: %v", err)
					}
					stopped = time.Now()
					if m != ModeProcessGroup {
						for _, pid := range pids {
							if alive(pid) {
								t.Fatalf("process %d is alive after its step returned", pid)
							}
						}
					}
				}
				checkStopped(t, m == ModeProcessGroup, dir, pids, stopped, time.Second)
			})
		}
	}
}

// TestHelperContainParent is the parent of TestContainedStepsDieWithTheirParent and
// TestContainedStepsStopAtTheirTrustDeadline: it runs one exec step (the escape script)
// until it is killed. (Skipped unless one of them started it.)
func TestHelperContainParent(t *testing.T) {
	dir := os.Getenv("FLOW_STEPS_CONTAIN_HELPER")
	if dir == "" {
		t.Skip("helper process of the containment tests")
	}
	input := in(map[string]any{"command": list("sh", filepath.Join(dir, "escape.sh"))})
	if os.Getenv("FLOW_STEPS_CONTAIN_TRUST") != "" {
		// Renewals: the deadline moves on as long as this process runs. Frozen, it does
		// not, and the step's init must stop the step when the last one passes.
		input.TrustUntil = func() time.Time { return time.Now().Add(300 * time.Millisecond) }
		input.StopGrace = 100 * time.Millisecond
	}
	_, err := Exec{MaxOutput: 1 << 10, mode: Mode(os.Getenv("FLOW_STEPS_CONTAIN_MODE"))}.Run(context.Background(), input)
	t.Fatalf("the step returned: %v", err)
}

// startHelperParent starts TestHelperContainParent running the escape script in mode
// m, and returns it once the escaped processes run, with their PIDs.
func startHelperParent(t *testing.T, m Mode, trust bool) (*exec.Cmd, string, []int) {
	t.Helper()
	dir := t.TempDir()
	escapeScript(t, dir, "exec sleep 600")
	parent := exec.Command(os.Args[0], "-test.run=^TestHelperContainParent$")
	parent.Env = append(os.Environ(), "FLOW_STEPS_CONTAIN_HELPER="+dir, "FLOW_STEPS_CONTAIN_MODE="+string(m))
	if trust {
		parent.Env = append(parent.Env, "FLOW_STEPS_CONTAIN_TRUST=1")
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = parent.Process.Signal(syscall.SIGCONT)
		_ = parent.Process.Kill()
		_ = within.Cmd(t, 30*time.Second, parent, "the step's parent after its SIGKILL")
	})
	return parent, dir, escapees(t, dir)
}

// Invariant 8, kill -9, for what the command started: the process running a step is
// SIGKILLed; every process of the step dies with it, the escaped ones included (in a
// namespace the init gets the parent-death signal and the kernel kills the namespace;
// a subreaper init sees its control pipe close and kills its descendants). The control
// without containment: Pdeathsig kills the command, but the escaped processes go on.
func TestContainedStepsDieWithTheirParent(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(modeName(m), func(t *testing.T) {
			parent, dir, pids := startHelperParent(t, m, false)
			killed := time.Now()
			_ = parent.Process.Kill()
			_ = within.Cmd(t, 30*time.Second, parent, "the step's parent after its SIGKILL")
			checkStopped(t, m == ModeProcessGroup, dir, pids, killed, time.Second)
		})
	}
}

// Invariant 8, a frozen owner: SIGSTOP of the process running a step does not stop the
// step's processes, and its lease lapses meanwhile. The step's init holds the lease's
// trust deadline (Input.TrustUntil, forwarded at each renewal) and stops the whole
// tree when it passes without a renewal: here within the 300ms deadline and a 100ms
// grace of the SIGSTOP. The control without containment has no such deadline: the
// escaped processes go on while their parent is frozen.
func TestContainedStepsStopAtTheirTrustDeadline(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(modeName(m), func(t *testing.T) {
			parent, dir, pids := startHelperParent(t, m, true)
			frozen := time.Now()
			if err := parent.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			checkStopped(t, m == ModeProcessGroup, dir, pids, frozen, time.Second)
		})
	}
}

// A step its init stops at the trust deadline returns an error that says so to the
// worker (errors.Is ErrTrustDeadline), whatever the exec step adds to it: the worker
// then runs it again while its lease holds, or ends the epoch, instead of failing the
// step (worker.DecideAttempt). The exec step once formatted the exit with %v, which
// dropped the mark: on a busy machine a renewal that came late failed a run whose lease
// never lapsed (clustertest TestWholeClusterRestart beside a CI run).
func TestTrustDeadlineStopIsMarked(t *testing.T) {
	for _, m := range modes(t) {
		if m == ModeProcessGroup {
			continue // no init, no trust deadline
		}
		t.Run(modeName(m), func(t *testing.T) {
			input := in(map[string]any{"command": list("sleep", "30")})
			deadline := time.Now().Add(200 * time.Millisecond)
			input.TrustUntil = func() time.Time { return deadline } // no renewal comes
			input.StopGrace = 100 * time.Millisecond
			done := make(chan error, 1)
			go func() {
				_, err := Exec{MaxOutput: 1 << 10, mode: m}.Run(context.Background(), input)
				done <- err
			}()
			err := within.Recv(t, 30*time.Second, done, "the step past its trust deadline")
			if !errors.Is(err, ErrTrustDeadline) {
				t.Fatalf("the step returned %v; want an error that is ErrTrustDeadline", err)
			}
		})
	}
}

// A renewal that reaches a slow init after the deadline it replaced does not stop the
// step: flowd wrote it before that deadline passed (forwardTrust moves no passed
// deadline), so the init reads what waits in its control pipe before it acts on a
// deadline (lateTrust). The init here starts 300ms late (SlowStart, an init starved of
// the CPU), its first deadline 100ms after the step began, and the renewal that moves it
// 5s on is in the pipe before it passes: every run succeeds. The control reads no late
// renewal and stops the step at the passed deadline, as a busy CI machine saw
// (clustertest TestWholeClusterRestart: steps stopped and run again within one epoch
// whose lease never lapsed, until the node gave the run up).
func TestLateRenewalReachesASlowInit(t *testing.T) {
	const runs = 6
	run := func(t *testing.T, m Mode) (stopped int) {
		initStartDelay = 300 * time.Millisecond
		t.Cleanup(func() { initStartDelay, ignoreLateTrust = 0, false })
		for range runs {
			input := in(map[string]any{"command": list("sh", "-c", "sleep 0.3; echo '{}'")})
			first := time.Now().Add(100 * time.Millisecond)
			var calls atomic.Int32
			input.TrustUntil = func() time.Time {
				if calls.Add(1) == 1 {
					return first // the spec's deadline
				}
				return time.Now().Add(5 * time.Second) // renewed, from forwardTrust's first look on
			}
			input.StopGrace = 100 * time.Millisecond
			_, err := Exec{MaxOutput: 1 << 10, mode: m}.Run(context.Background(), input)
			switch {
			case errors.Is(err, ErrTrustDeadline):
				stopped++
			case err != nil:
				t.Fatal(err)
			}
		}
		return stopped
	}
	for _, m := range modes(t) {
		if m == ModeProcessGroup {
			continue // no init, no trust deadline
		}
		t.Run(modeName(m), func(t *testing.T) {
			if n := run(t, m); n != 0 {
				t.Fatalf("%d of %d steps were stopped at a deadline their renewal had moved before it passed", n, runs)
			}
		})
		t.Run("control-ignore-late-trust/"+modeName(m), func(t *testing.T) {
			ignoreLateTrust = true
			if n := run(t, m); n == 0 {
				t.Fatalf("no step of %d was stopped with the init reading no late renewal: the test cannot see the guard", runs)
			}
		})
	}
}
