package steps

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/within"
)

// attackC is a step that freezes its own init: it ptrace-seizes its parent (the init:
// PID 1 of its namespace, or the subreaper), interrupts it (a stop the init cannot
// refuse), says in DIR/attack whether that worked and in DIR/attack.pid who it is
// (nspid's form, for the cleanup of the controls' survivors), then writes a timestamp
// to DIR/marker every 20ms: the side effect that must stop at the step's trust deadline.
const attackC = `#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
	char path[4096], tmp[4096], buf[256], ns[128];
	pid_t init = getppid();
	ssize_t nl = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
	ns[nl > 0 ? nl : 0] = 0;
	int n = snprintf(buf, sizeof buf, "%s %d\n", ns, getpid());
	snprintf(path, sizeof path, "%s/attack.pid", argv[1]);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
	write(fd, buf, n);
	close(fd);
	long r = ptrace(PTRACE_SEIZE, init, 0, 0);
	if (r == 0)
		r = ptrace(PTRACE_INTERRUPT, init, 0, 0);
	n = r == 0 ? snprintf(buf, sizeof buf, "seized %d\n", init) : snprintf(buf, sizeof buf, "denied %s\n", strerror(errno));
	snprintf(tmp, sizeof tmp, "%s/attack.tmp", argv[1]);
	snprintf(path, sizeof path, "%s/attack", argv[1]);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
	write(fd, buf, n);
	close(fd);
	rename(tmp, path);
	snprintf(path, sizeof path, "%s/marker", argv[1]);
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
		n = snprintf(buf, sizeof buf, "%lld%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
		write(fd, buf, n);
		close(fd);
		usleep(20000);
	}
}
`

// TestHelperTraceParent is the process running the attacking step of
// TestTracedInitStillStopsAtTheTrustDeadline, as flowd would (skipped unless it started
// it). Its lease renews (the trust deadline 500ms ahead) until the step says it
// attacked, then stops renewing, as a lost lease or a frozen kill switch (the zombie
// drill) would, while this process goes on: its context never ends, so only the trust
// deadline stops the step. It writes how the step ended to DIR/result.
func TestHelperTraceParent(t *testing.T) {
	dir := os.Getenv("FLOW_STEPS_TRACE_HELPER")
	if dir == "" {
		t.Skip("helper process of the traced-init test")
	}
	controls := os.Getenv("FLOW_STEPS_TRACE_CONTROLS")
	keepInitDumpable = strings.Contains(controls, "dumpable")
	noOutsideWatchdog = strings.Contains(controls, "no-watchdog")
	input := in(map[string]any{"command": list(filepath.Join(filepath.Dir(dir), "attack"), dir)})
	var last time.Time
	input.TrustUntil = func() time.Time {
		if _, err := os.Stat(filepath.Join(dir, "attack")); err != nil || last.IsZero() {
			last = time.Now().Add(500 * time.Millisecond)
		}
		return last
	}
	input.StopGrace = 100 * time.Millisecond
	_, err := Exec{MaxOutput: 1 << 10, mode: Mode(os.Getenv("FLOW_STEPS_TRACE_MODE"))}.Run(context.Background(), input)
	_ = os.WriteFile(filepath.Join(dir, "result.tmp"), []byte(err.Error()), 0o644)
	_ = os.Rename(filepath.Join(dir, "result.tmp"), filepath.Join(dir, "result")) // whole, or not there
}

// Issue 36, item 4: a step that ptrace-seizes its init and interrupts it (so that the
// init cannot act at the trust deadline) is still stopped at that deadline, while the
// process running it (flowd) goes on but its lease is no longer renewed. Two things
// hold it: the init is not dumpable, so a step of its own user may not trace it (the
// attack is denied), and flowd kills the step itself when the init has not stopped it
// by the deadline and the grace (outsideKill). Each is shown alone, and the control
// has neither: the attack succeeds and the step writes on past its deadline.
//
// As a plain user (65534), in user-pid-namespace and subreaper modes, the step runs as
// the init's user: the dumpable flag decides. As root (pid-namespace), a root step
// has CAP_SYS_PTRACE and traces its init whatever the flag (why root flowd's steps run
// as nobody): only flowd's own kill stops it, and its control has none.
func TestTracedInitStillStopsAtTheTrustDeadline(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: to run the step's parent as another user (65534), and the pid-namespace case")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler for the attacking step:", err)
	}
	base, err := os.MkdirTemp("", "flow-trace-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "attack.c"), []byte(attackC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-O", "-o", filepath.Join(base, "attack"), filepath.Join(base, "attack.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	self := filepath.Join(base, "steps.test") // where user 65534 may run this binary from
	if b, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(self, b, 0o755) != nil {
		t.Fatalf("copying the test binary: %v", err)
	}
	type variant struct {
		mode     Mode
		nobody   bool
		controls string
		attack   string // the attack's outcome: "seized" or "denied"
		outlives bool   // the control's damage
	}
	var vs []variant
	if Containment() == ModePIDNamespace {
		vs = append(vs,
			variant{ModePIDNamespace, false, "", "seized", false},
			variant{ModePIDNamespace, false, "no-watchdog", "seized", true})
	}
	for _, m := range []Mode{ModeUserPIDNamespace, ModeSubreaper} {
		vs = append(vs,
			variant{m, true, "", "denied", false},
			variant{m, true, "no-watchdog", "denied", false},
			variant{m, true, "dumpable", "seized", false},
			variant{m, true, "dumpable,no-watchdog", "seized", true})
	}
	for _, v := range vs {
		name := string(v.mode) + map[bool]string{true: "/as-65534", false: "/as-root"}[v.nobody]
		if v.controls != "" {
			name += "/" + v.controls
		}
		if v.outlives {
			name += "/control"
		}
		t.Run(name, func(t *testing.T) {
			dir, err := os.MkdirTemp(base, "run-")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			parent := exec.Command(self, "-test.run=^TestHelperTraceParent$")
			parent.Env = append(os.Environ(), "FLOW_STEPS_TRACE_HELPER="+dir, "FLOW_STEPS_TRACE_MODE="+string(v.mode),
				"FLOW_STEPS_TRACE_CONTROLS="+v.controls, "TMPDIR=/tmp")
			if v.nobody {
				parent.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			var out strings.Builder
			parent.Stdout, parent.Stderr = &out, &out
			if err := parent.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				var ps []byte
				if t.Failed() {
					ps, _ = exec.Command("ps", "-eo", "pid,ppid,user,stat,wchan:24,cmd", "--forest").CombinedOutput()
					_ = parent.Process.Signal(syscall.SIGQUIT) // its goroutines, in its output
					_ = within.Cmd(t, 30*time.Second, parent, "the step's parent after its SIGQUIT")
				}
				_ = parent.Process.Kill()
				_ = within.Cmd(t, 30*time.Second, parent, "the step's parent after its SIGKILL")
				if t.Failed() {
					t.Logf("the step's parent (%d):\n%s\nprocesses:\n%s", parent.Process.Pid, out.String(), ps)
				}
			})
			var attack string
			waitUntil(t, 20*time.Second, "the step to attack its init", func() bool {
				b, err := os.ReadFile(filepath.Join(dir, "attack"))
				attack = string(b)
				return err == nil
			})
			attacked := time.Now()
			// The controls' survivor: killed, it lets go of its init (which then sees its
			// control pipe closed, and ends).
			attacker := readPid(t, filepath.Join(dir, "attack.pid"))
			t.Cleanup(func() { _ = syscall.Kill(attacker, syscall.SIGKILL) })
			if !strings.HasPrefix(attack, v.attack) {
				t.Fatalf("the step's ptrace of its init: %q; want %s", attack, v.attack)
			}
			// The last deadline is at most 500ms after the attack was seen; the step must
			// be dead within a second of it (the grace is 100ms).
			deadline := attacked.Add(500 * time.Millisecond)
			if v.outlives {
				checkStopped(t, true, dir, nil, deadline, time.Second)
				return
			}
			var result string
			waitUntil(t, 10*time.Second, "the step to return", func() bool {
				b, err := os.ReadFile(filepath.Join(dir, "result"))
				result = string(b)
				return err == nil
			})
			if !strings.Contains(result, ErrTrustDeadline.Error()) {
				t.Fatalf("the step returned %q; want it stopped at its trust deadline", result)
			}
			checkStopped(t, false, dir, []int{attacker}, deadline, time.Second)
		})
	}
}
