// Package beats is a step's side effect that tests can read back in time: an exec step
// that writes "RUN EPOCH NANOS" to a file every 20ms while it runs, and the intervals
// each run (or each epoch of a run) was seen running in, to check that runs which must
// not run at once (a concurrency key's) never did, in real time, nor two epochs of one.
package beats

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Workflow is a workflow named name, keyed by `concurrency: {key: "acct-{{ inputs.acct }}",
// limit: limit}`, whose one step writes a beat to dir/beats every 20ms, n times. dir is
// made writable by anyone: steps may run as another user.
func Workflow(t testing.TB, name, dir string, n, limit int) string {
	t.Helper()
	script := beatScript(t, dir, n)
	return fmt.Sprintf("name: %s\nconcurrency: {key: \"acct-{{ inputs.acct }}\", limit: %d}\ninputs:\n  acct: {type: string}\nsteps:\n  - name: pay\n    uses: exec\n    with: {command: [sh, -c, %q]}\n",
		name, limit, script)
}

// StepWorkflow is a workflow named name whose step pay (after a step prep that does
// nothing) is keyed by `concurrency: {key: "acct-{{ inputs.acct }}", limit: limit}` and
// writes a beat to dir/beats every 20ms, n times: the step's slots, not the run's. The
// workflow also has a key of its own, "runs-{{ inputs.acct }}" with limit+1: a run
// parked for its step's slot keeps the workflow's, and the two never wait for each
// other.
func StepWorkflow(t testing.TB, name, dir string, n, limit int) string {
	t.Helper()
	script := beatScript(t, dir, n)
	return fmt.Sprintf("name: %s\nconcurrency: {key: \"runs-{{ inputs.acct }}\", limit: %d}\ninputs:\n  acct: {type: string}\nsteps:\n  - name: prep\n    uses: noop\n  - name: pay\n    uses: exec\n    needs: [prep]\n    concurrency: {key: \"acct-{{ inputs.acct }}\", limit: %d}\n    with: {command: [sh, -c, %q]}\n",
		name, limit+1, limit, script)
}

// beatScript is the shell of a step that writes "RUN EPOCH NANOS" to dir/beats every
// 20ms, n times; dir is made writable by anyone (steps may run as another user).
func beatScript(t testing.TB, dir string, n int) string {
	t.Helper()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "$FLOW_RUN_ID $FLOW_EPOCH $(date +%%s%%N)" >> %s/beats; sleep 0.02; i=$((i+1)); done`, n, dir)
}

// Interval is the first and last beat of a run (Unix ns).
type Interval struct{ First, Last int64 }

// Intervals reads dir/beats: each run's first and last beat.
func Intervals(dir string) map[string]Interval {
	return read(dir, func(run, _ string) string { return run })
}

// Executions reads dir/beats: the first and last beat of each epoch of each run, keyed
// "RUN@EPOCH". Two epochs of one run are two executions: a paused owner's step that
// went on beside its run's next epoch crosses it here.
func Executions(dir string) map[string]Interval {
	return read(dir, func(run, epoch string) string { return run + "@" + epoch })
}

func read(dir string, key func(run, epoch string) string) map[string]Interval {
	b, _ := os.ReadFile(filepath.Join(dir, "beats"))
	out := map[string]Interval{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue // a line being written
		}
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		k := key(f[0], f[1])
		iv, ok := out[k]
		if !ok {
			iv = Interval{n, n}
		}
		out[k] = Interval{min(iv.First, n), max(iv.Last, n)}
	}
	return out
}

// Keys are ivs' keys, sorted.
func Keys(ivs map[string]Interval) []string {
	keys := make([]string, 0, len(ivs))
	for k := range ivs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
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
				out = append(out, fmt.Sprintf("%s/%s (%s at once)", a, b, time.Duration(min(x.Last, y.Last)-max(x.First, y.First))))
			}
		}
	}
	return out
}

// ShortestGap is the shortest time between one run's last beat and the next run's first,
// the runs ordered by their first beat (0 with fewer than two runs).
func ShortestGap(ivs map[string]Interval) time.Duration {
	var all []Interval
	for _, iv := range ivs {
		all = append(all, iv)
	}
	slices.SortFunc(all, func(a, b Interval) int { return cmp.Compare(a.First, b.First) })
	var gap time.Duration
	for i := 1; i < len(all); i++ {
		if g := time.Duration(all[i].First - all[i-1].Last); i == 1 || g < gap {
			gap = g
		}
	}
	return gap
}
