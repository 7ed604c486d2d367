package steps

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// noDeathSignal switches Pdeathsig off (Linux). It is empty in every build but the
// negative control of the kill -9 test, which sets it at link time
// (-ldflags "-X github.com/flowrun/flow/steps.noDeathSignal=1") to show that without
// the signal a step outlives a SIGKILLed flowd.
var noDeathSignal string

// groups is the set of process groups of exec steps running in this process. It is
// process-wide on purpose: its one reader is the poison pill, which ends the whole
// process, every engine in it included, and must take their steps with it.
var groups struct {
	sync.Mutex
	live map[int]struct{}
}

// KillProcessGroups sends SIGKILL to the process group of every exec step still
// running in this process and returns how many it signalled. The poison pill calls it
// before it exits: Pdeathsig kills a step's own process when this process dies, but not
// the children that process started; killing the groups first covers those too.
func KillProcessGroups() int {
	groups.Lock()
	defer groups.Unlock()
	for pgid := range groups.live {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
	return len(groups.live)
}

// groupDone kills whatever is left of a step's process group and forgets it.
func groupDone(pgid int) {
	groups.Lock()
	defer groups.Unlock()
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	delete(groups.live, pgid)
}

// start starts cmd and returns a channel that gets cmd.Wait's result.
//
// The child is started and waited for by one goroutine locked to its OS thread. Linux
// sends the parent-death signal (Pdeathsig) when the *thread* that forked the child
// exits, not the process (prctl(2); golang/go#27505), and a Go thread exits when a
// goroutine locked to it returns without unlocking, which any library may do. Locked
// here, no other goroutine runs on this thread until the child has been reaped, so the
// thread lives at least as long as the child and the signal fires only when the whole
// process dies. The cost is one OS thread per running exec step, mostly blocked in wait.
func start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Unlocked only once the child is reaped: from then on the thread may be reused
		// or end, and no child of it is left for its death to signal.
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		groups.Lock()
		if groups.live == nil {
			groups.live = map[int]struct{}{}
		}
		groups.live[cmd.Process.Pid] = struct{}{} // Setpgid: its pid is its group's id
		groups.Unlock()
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}
