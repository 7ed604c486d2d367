package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// A whole-run timeout (docs/workflow-spec.md, "Retries and timeouts": counted from
// submission; when it passes the run fails) ends a run whose step has no timeout of its
// own: the run fails with the run timeout, the running step's process is stopped, and
// the steps after it never run.
func TestRunTimeoutFailsTheRunAndStopsItsStep(t *testing.T) {
	e := startEngine(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	apply(t, e, `
name: deadline
timeout: 1s
steps:
  - name: hang
    uses: exec
    with: {command: [sh, -c, 'read hp _ < /proc/self/stat; echo $hp > `+pidFile+`; exec sleep 30']}
  - name: after
    needs: [hang]
    uses: noop
`)
	start := time.Now()
	v := runToEnd(t, e, "deadline", nil)
	took := time.Since(start)
	if v.Run.Status != checkpoint.StatusFailed || !strings.Contains(v.Run.Error, "run timeout 1s") {
		t.Fatalf("run %s, error %q; want failed with the run timeout", v.Run.Status, v.Run.Error)
	}
	if took < time.Second || took > 6*time.Second {
		t.Fatalf("the run ended after %s; want soon after its 1s timeout", took)
	}
	seen := false
	for _, st := range v.Steps {
		if st.Name == "after" {
			seen = true
			if st.Status != checkpoint.StepPending {
				t.Fatalf("step after the timed-out one: %s", st.Status)
			}
		}
	}
	if !seen {
		t.Fatalf("no step \"after\" in %+v", v.Steps)
	}
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the step never started: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	// The step returns once its command has exited (and was reaped): the process is gone.
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the step's process %d is still there after the run timed out: %v", pid, err)
	}
}
