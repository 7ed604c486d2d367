package steps

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/nspid"
	"github.com/flowrun/flow/internal/testkit/within"
)

// alive reports whether pid is a live process: a zombie (dead, not yet reaped by
// whoever inherited it) counts as dead.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil && runtime.GOOS != "linux"
	}
	// pid (comm) state ...: comm may hold spaces and parentheses; the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

// waitUntil polls cond (the state of other processes, which nothing signals) until it
// holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond) // polling other processes, with a deadline
	}
}

// hostPid is shell that prints the shell's own PID namespace and PID there, from which
// readPid finds the PID this test sees: in pid-namespace mode the step has a /proc of
// its own, where $$ and /proc/self are the namespace's numbers (nspid).
const hostPid = nspid.Shell

func readPid(t *testing.T, file string) int {
	t.Helper()
	var pid int
	waitUntil(t, 10*time.Second, "the step's pid in "+file, func() bool {
		b, err := os.ReadFile(file)
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false
		}
		var ok bool
		pid, ok = nspid.Host(string(b))
		return ok
	})
	return pid
}

// A step stopped by its context gets Input.StopGrace, not the 2s default, between
// SIGTERM and SIGKILL: the engine keeps it under its lease TTL.
func TestExecStopGraceCutsTheKillGrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    Exec
		stop time.Duration
		min  time.Duration
		max  time.Duration
	}{
		// The short graces end the step well before the 2 s default: under 3/4 of it, a
		// margin of over a second on a loaded machine.
		{"stop-grace-wins", Exec{MaxOutput: 1 << 10}, 100 * time.Millisecond, 100 * time.Millisecond, KillGrace * 3 / 4},
		{"exec-grace-is-shorter", Exec{MaxOutput: 1 << 10, KillGrace: 150 * time.Millisecond}, time.Hour, 150 * time.Millisecond, KillGrace * 3 / 4},
		{"control-default", Exec{MaxOutput: 1 << 10}, 0, KillGrace, KillGrace + 2*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pid")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			input := in(map[string]any{"command": list("sh", "-c", `trap '' TERM; `+hostPid+` > `+pidFile+`; while true; do sleep 0.02; done`)})
			input.StopGrace = tc.stop
			done := make(chan error, 1)
			go func() { _, err := tc.x.Run(ctx, input); done <- err }()
			pid := readPid(t, pidFile)
			stopped := time.Now()
			cancel()
			err := within.Recv(t, 30*time.Second, done, "the stopped step")
			took := time.Since(stopped)
			if !errors.Is(err, context.Canceled) || took < tc.min || took > tc.max {
				t.Fatalf("err %v after %s; want the cancel after %s..%s", err, took, tc.min, tc.max)
			}
			if alive(pid) {
				t.Fatalf("process %d survived", pid)
			}
		})
	}
}

// KillProcessGroups (what the poison pill calls before it exits) kills every running
// exec step: the step's process and what it started, in every containment mode (and
// its process group without containment).
func TestKillProcessGroupsKillsStepsAndTheirChildren(t *testing.T) {
	for _, m := range modes(t) {
		t.Run(string(m), func(t *testing.T) {
			dir := t.TempDir()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = Exec{MaxOutput: 1 << 10, mode: m}.Run(context.Background(), in(map[string]any{"command": list("sh", "-c",
						`trap '' TERM; (trap '' TERM; `+hostPid+` > `+filepath.Join(dir, "child"+strconv.Itoa(i))+`; exec sleep 60) & `+hostPid+` > `+filepath.Join(dir, "pid"+strconv.Itoa(i))+`; wait`)}))
				}()
			}
			var pids []int
			for i := range errs {
				pids = append(pids, readPid(t, filepath.Join(dir, "pid"+strconv.Itoa(i))), readPid(t, filepath.Join(dir, "child"+strconv.Itoa(i))))
			}
			if n := KillProcessGroups(); n < 2 {
				t.Fatalf("killed %d steps; want 2", n)
			}
			for _, pid := range pids { // dead when KillProcessGroups returns (but without containment)
				if m != ModeProcessGroup && alive(pid) {
					t.Fatalf("process %d alive after KillProcessGroups returned", pid)
				}
			}
			within.Group(t, 30*time.Second, &wg, "the killed steps to return")
			for _, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("step: %v; want it killed", err)
				}
			}
			for _, pid := range pids {
				waitUntil(t, 2*time.Second, "process "+strconv.Itoa(pid)+" to die", func() bool { return !alive(pid) })
			}
			if n := KillProcessGroups(); n != 0 {
				t.Fatalf("%d steps still registered after they returned", n)
			}
		})
	}
}
