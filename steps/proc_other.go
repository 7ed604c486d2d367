//go:build !linux

package steps

import "syscall"

// procAttr puts the command in its own process group. Other systems have no
// parent-death signal: a step there outlives a SIGKILLed flowd (docs/workflow-spec.md).
func procAttr(u *User) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: u.credential()}
}
