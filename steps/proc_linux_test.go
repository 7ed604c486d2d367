package steps

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/internal/testkit/within"
)

// The kill -9 of flowd, at the level of this package: a process running an exec step is
// SIGKILLed; the step's process dies with it (its init's parent-death signal, or the
// init's sweep; without containment, its own Pdeathsig) and never does what it was to
// do after its parent's death. The control switches containment and Pdeathsig off: the
// step's process outlives its parent and does it (two copies at once, once another
// epoch runs the step).
func TestStepDiesWithItsProcess(t *testing.T) {
	for _, control := range []bool{false, true} {
		t.Run(map[bool]string{false: "pdeathsig", true: "control-without-pdeathsig"}[control], func(t *testing.T) {
			dir := t.TempDir()
			parent := exec.Command(os.Args[0], "-test.run=^TestHelperStepParent$")
			parent.Env = append(os.Environ(), "FLOW_STEPS_HELPER="+dir)
			if control {
				parent.Env = append(parent.Env, "FLOW_STEPS_HELPER_NO_DEATHSIG=1")
			}
			if err := parent.Start(); err != nil {
				t.Fatal(err)
			}
			pid := readPid(t, filepath.Join(dir, "pid"))
			t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }) // the control's survivor
			_ = parent.Process.Kill()
			_ = within.Cmd(t, 30*time.Second, parent, "the step's parent after its SIGKILL")
			marker := filepath.Join(dir, "after-parent-died")
			if control {
				waitUntil(t, 10*time.Second, "the orphaned step to act", func() bool { _, err := os.Stat(marker); return err == nil })
				return
			}
			waitUntil(t, 2*time.Second, "the step's process to die with its parent", func() bool { return !alive(pid) })
			// The step acts only after it sees its parent gone, which is after the kernel
			// sent it SIGKILL: dead now, it never will.
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the step acted after its parent died")
			}
		})
	}
}

// TestHelperStepParent is the parent process of TestStepDiesWithItsProcess: it runs
// one exec step until it is killed. (Skipped unless that test started it.)
func TestHelperStepParent(t *testing.T) {
	dir := os.Getenv("FLOW_STEPS_HELPER")
	if dir == "" {
		t.Skip("helper process of TestStepDiesWithItsProcess")
	}
	x := Exec{MaxOutput: 1 << 10}
	if os.Getenv("FLOW_STEPS_HELPER_NO_DEATHSIG") != "" {
		noDeathSignal = "1"
		x.mode = ModeProcessGroup
	}
	// The step waits for its parent to go (kill -0 fails once the parent is reaped: its
	// init, or without containment this process), then acts: the side effect a step of a
	// dead flowd must not have.
	_, err := x.Run(context.Background(), in(map[string]any{"command": list("sh", "-c",
		hostPid+` > `+dir+`/pid; while kill -0 $PPID 2>/dev/null; do sleep 0.02; done; touch `+dir+`/after-parent-died`)}))
	t.Fatalf("the step returned: %v", err)
}

// Go threads end (a goroutine locked to its thread returns without unlocking), and
// Pdeathsig fires when the thread that forked the child ends, not the process: a step
// started from an arbitrary thread could be killed by an unrelated goroutine's exit.
// start forks from a thread locked until the child is reaped: many threads ending do not
// touch the step. The control forks from a thread that then ends: the child is killed,
// which is why start locks.
func TestStepSurvivesGoThreadsEnding(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	done := make(chan error, 1)
	go func() {
		_, err := Exec{MaxOutput: 1 << 10}.Run(context.Background(), in(map[string]any{"command": list("sh", "-c",
			hostPid+` > `+dir+`/pid; while [ ! -e `+release+` ]; do sleep 0.02; done`)}))
		done <- err
	}()
	pid := readPid(t, filepath.Join(dir, "pid"))
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // and return locked: the runtime ends this thread
		}()
	}
	within.Group(t, 30*time.Second, &wg, "the goroutines that end their threads")
	if !alive(pid) {
		t.Fatalf("the step's process %d died with a Go thread", pid)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := within.Recv(t, 10*time.Second, done, "the released step"); err != nil {
		t.Fatalf("the step did not finish on its own: %v (its forking thread's end killed it?)", err)
	}

	t.Run("control-fork-from-a-thread-that-ends", func(t *testing.T) {
		// The main thread never ends (the runtime wedges it instead): a goroutine that
		// lands there stays, locked, until the test ends, and the next one tries again.
		hold := make(chan struct{})
		defer close(hold)
		var cmd *exec.Cmd
		for deadline := time.Now().Add(10 * time.Second); cmd == nil; {
			if time.Now().After(deadline) {
				t.Fatal("no goroutine off the main thread within 10s")
			}
			c := exec.Command("sleep", "60")
			c.SysProcAttr = procAttr(nil)
			started := make(chan error, 1)
			onMain := make(chan bool, 1)
			go func() {
				runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
				if syscall.Gettid() == os.Getpid() {
					onMain <- true
					<-hold
					return
				}
				onMain <- false
				started <- c.Start()
			}()
			if within.Recv(t, 10*time.Second, onMain, "the forking goroutine's thread") {
				continue
			}
			if err := within.Recv(t, 10*time.Second, started, "the child's start"); err != nil {
				t.Fatal(err)
			}
			cmd = c
		}
		err := within.Cmd(t, 30*time.Second, cmd, "the child of an ended thread")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("child of an ended thread: %v; want killed by SIGKILL", err)
		}
	})
}
