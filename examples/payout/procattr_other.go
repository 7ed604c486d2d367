//go:build !linux

package main

import "syscall"

// childProcAttr: without Linux's parent-death signal, the demo's deferred stop is what
// ends the chaos nodes.
func childProcAttr() *syscall.SysProcAttr { return nil }
