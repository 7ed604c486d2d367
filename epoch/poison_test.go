package epoch

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/proctest"
	"github.com/flowrun/flow/steps"
)

// hostPid is shell that prints the shell's own PID as this test sees it: in the step's
// PID namespace $$ is the namespace's number, but /proc is the host's, and /proc/self is
// read by the shell itself (read is a builtin).
const hostPid = `read hp _ < /proc/self/stat; echo $hp`

// The poison pill kills the process groups of running exec steps before it exits
// (BeforeExit, which the engine sets to steps.KillProcessGroups): a step that ignores
// SIGTERM, and the child it started, are dead when Exit is called. Pdeathsig would kill
// only the step's own process at the exit, not its child. The control has no BeforeExit:
// both are still running when the process would exit.
func TestPoisonPillKillsStepGroupsBeforeExit(t *testing.T) {
	srv := startNATS(t)
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "kills-groups", true: "control-no-before-exit"}[control], func(t *testing.T) {
			ctx := ctxT(t, 30*time.Second)
			dir := t.TempDir()
			stepCtx, stopStep := context.WithCancel(context.Background())
			stepDone := make(chan error, 1)
			go func() {
				_, err := steps.Exec{MaxOutput: 1 << 10, KillGrace: 50 * time.Millisecond}.Run(stepCtx, steps.Input{Run: "run-6", Step: "s", Item: -1,
					With: map[string]any{"command": []any{"sh", "-c", `trap '' TERM; (trap '' TERM; ` + hostPid + ` > ` +
						filepath.Join(dir, "child") + `; exec sleep 60) & ` + hostPid + ` > ` + filepath.Join(dir, "pid") + `; wait`}}})
				stepDone <- err
			}()
			t.Cleanup(func() { stopStep(); <-stepDone })
			var pids []int
			for _, f := range []string{"pid", "child"} {
				var pid int
				waitFor(t, 10*time.Second, "the step's "+f, func() bool {
					b, err := os.ReadFile(filepath.Join(dir, f))
					pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
					return err == nil && strings.HasSuffix(string(b), "\n") && pid > 0
				})
				pids = append(pids, pid)
			}

			p := startProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
			_, jsCut := connect(t, p.url())
			aliveAtExit := make(chan []bool, 1)
			var killed atomic.Int32 // groups BeforeExit signalled, as Exit saw it
			cfg := testConfig()
			cfg.FastFail = true
			cfg.Exit = func(int) {
				var alive []bool
				for _, pid := range pids {
					alive = append(alive, proctest.Alive(pid))
				}
				aliveAtExit <- alive
			}
			if !control {
				cfg.BeforeExit = func() { killed.Store(int32(steps.KillProcessGroups())) }
			}
			ls, err := newLeases(ctx, jsCut, cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			l, err := ls.Acquire(ctx, "run-6", 60, "w")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(ctx)
			p.dropped.Store(true) // a partition: no renewal succeeds, the pill fires at 70% TTL
			var alive []bool
			select {
			case alive = <-aliveAtExit:
			case <-time.After(3 * testTTL):
				t.Fatal("poison pill did not fire")
			}
			if !control && killed.Load() != 1 {
				t.Fatalf("BeforeExit signalled %d groups before Exit; want the step's one", killed.Load())
			}
			// (A killed process may take a moment to become a zombie; the kill came before
			// Exit, so allow it that moment in the check below, not the kill.)
			for i, pid := range pids {
				if !control && alive[i] {
					waitFor(t, time.Second, "process "+strconv.Itoa(pid)+" killed before exit", func() bool { return !proctest.Alive(pid) })
				}
				if control && !alive[i] {
					t.Fatalf("control: process %d was dead at exit without BeforeExit", pid)
				}
			}
			if control {
				for _, pid := range pids {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		})
	}
}
