package checkpoint

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// benchRunID is run i's ID: scattered over the ID space as users' IDs are, so that the
// runs of a page are not neighbours in the run table (bijective, so never a duplicate).
func benchRunID(i int) string {
	x := uint64(i) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return fmt.Sprintf("run-%016x", x^(x>>31))
}

// BenchmarkQueryRuns: a page of 50 runs (run list, the web UI's runs page) in a state of
// FLOW_BENCH_RUNS runs (1,000,000 for docs/perf.md) created over three days, for each
// kind of query: the first page, and the page 100 pages in (its cursor found before the
// timer starts). Not run in CI: building the state takes minutes. docs/perf.md has the
// numbers.
//
//	FLOW_BENCH_RUNS=1000000 go test -run '^$' -bench QueryRuns -timeout 1h -v ./checkpoint
func BenchmarkQueryRuns(b *testing.B) {
	env := os.Getenv("FLOW_BENCH_RUNS")
	if env == "" {
		b.Skip("set FLOW_BENCH_RUNS (e.g. 1000000) to build a state of that many runs")
	}
	n, err := strconv.Atoi(env)
	if err != nil || n <= 0 {
		n = 1_000_000
	}
	// FLOW_BENCH_DIR keeps the state for the next run, which then skips the build.
	dir := os.Getenv("FLOW_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	s, err := OpenStore(dir, StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { s.Close() }()
	if s.Applied() == 0 {
		began := time.Now()
		buildBenchState(b, s, n)
		b.Logf("%d runs applied in %s (%d messages)", n, time.Since(began).Round(time.Millisecond), s.Applied())
	} else {
		b.Logf("the state in %s: %d messages applied", dir, s.Applied())
	}

	last := t0.Add(3 * 24 * time.Hour)
	queries := []struct {
		name string
		q    RunQuery
	}{
		{"all", RunQuery{}},
		{"top-level", RunQuery{TopLevel: true}},
		{"workflow", RunQuery{Workflow: "wf1"}},
		{"status", RunQuery{Statuses: []RunStatus{StatusSucceeded}}},
		{"workflow+status", RunQuery{Workflow: "wf1", Statuses: []RunStatus{StatusFailed}}},
		{"rare status", RunQuery{Statuses: []RunStatus{StatusDeadLettered}}},
		{"last hour", RunQuery{Since: last.Add(-time.Hour)}},
		{"a day two days ago, oldest first", RunQuery{Since: last.Add(-48 * time.Hour), Until: last.Add(-24 * time.Hour), Oldest: true}},
		{"failed of a workflow yesterday", RunQuery{Workflow: "wf2", Statuses: []RunStatus{StatusFailed}, Since: last.Add(-24 * time.Hour)}},
	}
	type pageCase struct {
		name string
		q    RunQuery
	}
	var cases []pageCase
	for _, f := range queries {
		q := f.q
		q.Limit = 50
		deep := q
		for range 100 {
			_, next, err := s.QueryRuns(deep)
			if err != nil {
				b.Fatal(err)
			}
			if next == "" {
				b.Logf("%s: fewer than 101 pages: page101 is the last", f.name)
				break
			}
			deep.After = next
		}
		cases = append(cases, pageCase{f.name + "/first", q}, pageCase{f.name + "/page101", deep})
	}
	// Each page twice: in the state as the applier left it, and after a full compaction
	// (the runs of a page then in the bottom level, read through fewer tables).
	measure := func(stage string) {
		for _, c := range cases {
			b.Run(stage+"/"+c.name, func(b *testing.B) {
				for b.Loop() {
					if _, _, err := s.QueryRuns(c.q); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(stage+"/id-prefix", func(b *testing.B) {
			for b.Loop() {
				if runs, err := s.RunsWithIDPrefix("run-7", 50); err != nil || len(runs) != 50 {
					b.Fatalf("%d runs, %v", len(runs), err)
				}
			}
		})
	}
	measure("applied")

	// Before the index: the newest 50 runs of a workflow could only come from reading
	// every run (ListRuns filters by workflow as it walks the run table).
	began := time.Now()
	var top []Run
	if err := s.EachRun(ListOptions{Workflow: "wf1"}, func(r *Run) bool {
		top = append(top, *r)
		if len(top) > 1000 {
			slices.SortFunc(top, func(a, b Run) int { return cmp.Compare(b.CreatedSeq, a.CreatedSeq) })
			top = top[:50]
		}
		return true
	}); err != nil {
		b.Fatal(err)
	}
	b.Logf("without the index, the newest 50 runs of a workflow by reading every run: %s", time.Since(began).Round(time.Millisecond))

	// What the index costs on disk, the whole state compacted so that each table's
	// estimate is its share of the sstables.
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		b.Fatal(err)
	}
	measure("compacted")
	usage := func(lo, hi string) uint64 {
		u, err := s.db.EstimateDiskUsage([]byte(lo), []byte(hi))
		if err != nil {
			b.Fatal(err)
		}
		return u
	}
	total, newest := usage("\x00", "\xff"), usage("b/", "b0")+usage("d/", "d0")+usage("g/", "g0")
	xw := usage("w/", "w0") + usage("x/", "x0")
	b.Logf("state on disk %.1f MiB (%.0f B/run); b/ d/ g/ indexes %.1f MiB (%.1f B/run); x/ and w/ indexes %.1f MiB (%.1f B/run)",
		float64(total)/(1<<20), float64(total)/float64(n), float64(newest)/(1<<20), float64(newest)/float64(n),
		float64(xw)/(1<<20), float64(xw)/float64(n))

	// An open with the index current, then one of an old state (no index, and no
	// tombstones of it: compacted), which builds it.
	reopen := func() time.Duration {
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		began := time.Now()
		if s, err = OpenStore(dir, StoreOptions{}); err != nil {
			b.Fatal(err)
		}
		return time.Since(began)
	}
	current := reopen()
	stripNewestIndex(b, s)
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		b.Fatal(err)
	}
	b.Logf("open: %s with the index current, %s for a state without it (built at open)",
		current.Round(time.Millisecond), reopen().Round(time.Millisecond))
}

// buildBenchState applies n runs in messages of 256 submits, each followed in the same
// message by what takes its run to its status: of every 20 runs, 4 stay pending, 2 run,
// 9 succeed (assigned to a worker, a commit, a completion), 2 fail, 2 are cancelled and
// 1 is dead-lettered. Four workflows; which run gets which is scattered.
func buildBenchState(b *testing.B, s *Store, n int) {
	const perMessage = 256
	// Entries written as JSON by hand: json.Marshal of each was a quarter of the setup.
	// The decoder is strict, so a mistake here fails the apply.
	// The runs are spread over three days, a message's at one time: `run list --since`
	// has a range to seek.
	step := 3 * 24 * time.Hour / time.Duration(max(n, 1))
	for first := 0; first < n; first += perMessage {
		at, _ := json.Marshal(t0.Add(time.Duration(first) * step))
		seq := s.Applied() + 1
		epoch := seq // an assign's epoch is its message's sequence
		var datas [][]byte
		for i := first; i < min(first+perMessage, n); i++ {
			id := benchRunID(i)
			h := uint64(len(id)) // a second scatter of i, for the workflow and status
			for _, c := range id {
				h = h*31 + uint64(c)
			}
			datas = append(datas, fmt.Appendf(nil, `{"k":"submit","run":%q,"submit":{"workflow":"wf%d","version":1,"trigger":"manual","max_epochs":3,"steps":[{"name":"one"}]},"at":%s}`, id, h%4, at))
			assign := fmt.Appendf(nil, `{"k":"assign","run":%q,"term":1,"worker":"w1","at":%s}`, id, at)
			complete := func(status string) []byte {
				return fmt.Appendf(nil, `{"k":"complete","run":%q,"epoch":%d,"owner":"w1","status":%q,"at":%s}`, id, epoch, status, at)
			}
			switch k := (h / 4) % 20; {
			case k < 4: // pending
			case k < 6:
				datas = append(datas, assign)
			case k < 15:
				datas = append(datas, assign,
					fmt.Appendf(nil, `{"k":"commit","run":%q,"epoch":%d,"owner":"w1","step":"one","item":-1,"output":{"ok":true},"at":%s}`, id, epoch, at),
					complete("succeeded"))
			case k < 17:
				datas = append(datas, assign, complete("failed"))
			case k < 19:
				datas = append(datas, fmt.Appendf(nil, `{"k":"cancel","run":%q,"reason":"operator","at":%s}`, id, at))
			default:
				datas = append(datas, fmt.Appendf(nil, `{"k":"dead_letter","run":%q,"term":1,"reason":"poison","at":%s}`, id, at))
			}
		}
		verdicts, err := s.Apply(seq, EncodeEnvelope("bench", datas))
		if err != nil {
			b.Fatal(err)
		}
		for i, v := range verdicts {
			if v != nil {
				b.Fatalf("message %d entry %d: %v", seq, i, v)
			}
		}
	}
}
