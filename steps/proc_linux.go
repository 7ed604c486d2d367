package steps

import "syscall"

// procAttr is how a command starts without containment (ModeProcessGroup): in its own
// process group (so that stopping it stops what it started, unless that leaves the
// group) and with SIGKILL from the kernel when this process dies, so that a kill -9 of
// flowd does not leave the command itself running. u, if not nil, is the user it runs as.
func procAttr(u *User) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: u.credential()}
	if noDeathSignal != "" {
		a.Pdeathsig = 0
	}
	return a
}
