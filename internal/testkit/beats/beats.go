// Package beats is a step's side effect that tests can read back in time: an exec step
// that writes "RUN NANOS" to a file every 20ms while it runs, and the intervals each run
// was seen running in, to check that runs which must not run at once (a concurrency
// key's) never did, in real time.
package beats

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Workflow is a workflow named name, keyed by `concurrency: {key: "acct-{{ inputs.acct }}",
// limit: limit}`, whose one step writes a beat to dir/beats every 20ms, n times. dir is
// made writable by anyone: steps may run as another user.
func Workflow(t testing.TB, name, dir string, n, limit int) string {
	t.Helper()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "$FLOW_RUN_ID $(date +%%s%%N)" >> %s/beats; sleep 0.02; i=$((i+1)); done`, n, dir)
	return fmt.Sprintf("name: %s\nconcurrency: {key: \"acct-{{ inputs.acct }}\", limit: %d}\ninputs:\n  acct: {type: string}\nsteps:\n  - name: pay\n    uses: exec\n    with: {command: [sh, -c, %q]}\n",
		name, limit, script)
}

// Interval is the first and last beat of a run (Unix ns).
type Interval struct{ First, Last int64 }

// Intervals reads dir/beats: each run's first and last beat.
func Intervals(dir string) map[string]Interval {
	b, _ := os.ReadFile(filepath.Join(dir, "beats"))
	out := map[string]Interval{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		iv, ok := out[f[0]]
		if !ok {
			iv = Interval{n, n}
		}
		out[f[0]] = Interval{min(iv.First, n), max(iv.Last, n)}
	}
	return out
}

// Crossings are the pairs of the runs given whose intervals cross ("a/b"), with how
// long they overlapped.
func Crossings(ivs map[string]Interval, runs []string) []string {
	var out []string
	for i, a := range runs {
		for _, b := range runs[i+1:] {
			x, okx := ivs[a]
			y, oky := ivs[b]
			if okx && oky && x.First <= y.Last && y.First <= x.Last {
				out = append(out, fmt.Sprintf("%s/%s (%.0fms)", a, b, float64(min(x.Last, y.Last)-max(x.First, y.First))/1e6))
			}
		}
	}
	return out
}
