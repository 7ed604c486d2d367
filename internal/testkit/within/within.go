// Package within is how tests wait: every wait has a deadline and says what it waited
// for, so that a test that would hang fails instead, naming what never came
// (docs/testing.md, "How the suite is run"). Tests only; production code does not import
// it.
package within

import (
	"errors"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Recv receives from ch, or fails the test when d passes first. A closed channel gives
// its zero value, so Recv also waits for a done channel.
func Recv[T any](t testing.TB, d time.Duration, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("%s: nothing within %s", what, d)
		var zero T
		return zero
	}
}

// Do calls f (a wait the test cannot give a deadline itself: a Stop, a Wait method) and
// waits for it to return, or fails the test when d passes first (f's goroutine is then
// left behind, and goleak names what it waited for).
func Do(t testing.TB, d time.Duration, f func(), what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	Recv(t, d, done, what)
}

// Group waits for wg, or fails the test when d passes first.
func Group(t testing.TB, d time.Duration, wg *sync.WaitGroup, what string) {
	t.Helper()
	Do(t, d, wg.Wait, what)
}

// killedWait is how long Cmd waits for a process it killed.
const killedWait = 5 * time.Second

// ErrKilled is what Cmd returns when it killed the process at its deadline.
var ErrKilled = errors.New("within: killed at its deadline")

// Cmd waits for a started cmd to exit and returns Wait's error; when d passes first it
// SIGKILLs the process, waits for it, and fails the test.
func Cmd(t testing.TB, d time.Duration, cmd *exec.Cmd, what string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		_ = cmd.Process.Kill()
		select {
		case <-done: // a SIGKILLed child is reaped at once
		case <-time.After(killedWait): // (unless its output is still held open by another)
		}
		t.Fatalf("%s: did not exit within %s (killed)", what, d)
		return ErrKilled
	}
}
