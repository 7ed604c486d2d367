package main

import "syscall"

// childProcAttr makes a chaos node die with this program, so that an interrupted demo
// leaves no node behind.
func childProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
