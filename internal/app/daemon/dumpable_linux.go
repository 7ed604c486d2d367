package daemon

import "syscall"

// keepDumpable is empty in every build but the negative control of
// TestStepsCannotReadFlowdsEnvironment, which sets it at link time
// (-X github.com/flowrun/flow/internal/app/daemon.keepDumpable=1) to show what a step reads
// of a dumpable flowd.
var keepDumpable string

const prSetDumpable = 4 // prctl(2)

// notDumpable makes this process not dumpable: its /proc files that matter (environ,
// mem, fd, maps...) belong to root and are closed to ptrace and to other processes of
// its own user, such as exec steps run as flowd's user; and it leaves no core dump.
// (cmdline stays readable by everyone: keep secrets out of flags.)
func notDumpable() (bool, error) {
	if keepDumpable != "" {
		return false, nil
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); e != 0 {
		return false, e
	}
	return true, nil
}
