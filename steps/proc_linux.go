package steps

import "syscall"

// procAttr puts the command in its own process group (so that stopping it stops what
// it started) and, on Linux, makes the kernel SIGKILL it when this process dies, so
// that a kill -9 of flowd does not leave the step running while a new epoch runs the
// same step elsewhere.
func procAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if noDeathSignal != "" {
		a.Pdeathsig = 0
	}
	return a
}
