// Package failtb is a testing.TB that records failures instead of ending the test: a
// negative control runs a property (rapid.Check) against it and asserts that the
// property failed, and how.
package failtb

import (
	"fmt"
	"testing"
)

// Recorder wraps a test's TB; its failures are recorded, not reported.
type Recorder struct {
	testing.TB
	failed bool
	Msgs   []string
}

// New records t's failures.
func New(t testing.TB) *Recorder { return &Recorder{TB: t} }

func (r *Recorder) Helper()                   {}
func (r *Recorder) Logf(string, ...any)       {}
func (r *Recorder) Log(...any)                {}
func (r *Recorder) Fail()                     { r.failed = true }
func (r *Recorder) Failed() bool              { return r.failed }
func (r *Recorder) Error(a ...any)            { r.fail(fmt.Sprint(a...)) }
func (r *Recorder) Errorf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }
func (r *Recorder) Fatal(a ...any)            { r.fail(fmt.Sprint(a...)) }
func (r *Recorder) Fatalf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }
func (r *Recorder) FailNow()                  { r.failed = true }
func (r *Recorder) Skip(...any)               {}
func (r *Recorder) Skipf(string, ...any)      {}
func (r *Recorder) SkipNow()                  {}
func (r *Recorder) Name() string              { return "negative-control" }
func (r *Recorder) fail(m string)             { r.failed = true; r.Msgs = append(r.Msgs, m) }
