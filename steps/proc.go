package steps

import (
	"os/exec"
	"runtime"
)

// noDeathSignal switches Pdeathsig off (Linux) where exec steps run without containment
// (ModeProcessGroup). It is empty in every build but negative controls, which set it at
// link time (-ldflags "-X github.com/flowrun/flow/steps.noDeathSignal=1", with
// containment=off) to show that without the signal a step outlives a SIGKILLed flowd.
var noDeathSignal string

// start starts cmd and returns a channel that gets cmd.Wait's result. started, if not
// nil, runs once the child exists and before start returns.
//
// The child is started and waited for by one goroutine locked to its OS thread. Linux
// sends the parent-death signal (Pdeathsig) when the *thread* that forked the child
// exits, not the process (prctl(2); golang/go#27505), and a Go thread exits when a
// goroutine locked to it returns without unlocking, which any library may do. Locked
// here, no other goroutine runs on this thread until the child has been reaped, so the
// thread lives at least as long as the child and the signal fires only when the whole
// process dies. The cost is one OS thread per running exec step, mostly blocked in wait.
func start(cmd *exec.Cmd, started func()) (<-chan error, error) {
	ok := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Unlocked only once the child is reaped: from then on the thread may be reused
		// or end, and no child of it is left for its death to signal.
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			ok <- err
			return
		}
		if started != nil {
			started()
		}
		ok <- nil
		waited <- cmd.Wait()
	}()
	if err := <-ok; err != nil {
		return nil, err
	}
	return waited, nil
}
