package webui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/flowrun/flow/checkpoint"
	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/app/apiserver"
)

// storeBackend serves the runs page's reads from a checkpoint.Store alone: the
// benchmark measures the page (the index page, the runs' records, the template) on a
// state too big to build through a log in a benchmark's time.
type storeBackend struct{ s *checkpoint.Store }

func (b storeBackend) Do(_ context.Context, op string, _ client.Request) (any, error) {
	if op == "workflow.list" {
		return []client.Workflow{{Name: "wf1", Version: 1}, {Name: "wf2", Version: 1}, {Name: "wf3", Version: 1}}, nil
	}
	return nil, &client.Error{Code: client.CodeBadRequest, Message: "not in the benchmark: " + op}
}

func (b storeBackend) RunsPage(_ context.Context, opts client.ListOptions) (client.RunPage, error) {
	q := checkpoint.RunQuery{Workflow: opts.Workflow, TopLevel: opts.TopLevel, After: opts.After, Limit: opts.Limit}
	for _, st := range opts.Statuses {
		q.Statuses = append(q.Statuses, checkpoint.RunStatus(st))
	}
	runs, next, err := b.s.QueryRuns(q)
	out := make([]client.Run, 0, len(runs))
	for _, r := range runs {
		out = append(out, client.Run{ID: r.ID, Workflow: r.Workflow, Version: r.Version, Status: string(r.Status), Epoch: r.Epoch,
			EpochChanges: r.EpochChanges, MaxEpochs: r.MaxEpochs, CreatedAt: r.CreatedAt.Format(time.RFC3339)})
	}
	return client.RunPage{Runs: out, Next: next}, err
}

func (b storeBackend) RunsWithIDPrefix(context.Context, string, int) ([]client.Run, error) {
	return nil, nil
}
func (b storeBackend) StepNeeds(string, int) ([]apiserver.StepNeeds, error) { return nil, nil }
func (b storeBackend) Versions(string) ([]client.Workflow, error)           { return nil, nil }
func (b storeBackend) Ticks(string, int) ([]client.Tick, error)             { return nil, nil }
func (b storeBackend) Changed() <-chan struct{}                             { return nil }
func (b storeBackend) AppliedRun(string) (client.Run, error) {
	return client.Run{}, &client.Error{Code: client.CodeNotFound, Message: "not in the benchmark"}
}

// BenchmarkRunsPage (issue 16): GET /ui/ (a page of 50 runs, newest first, rendered)
// with the state checkpoint's BenchmarkQueryRuns built in FLOW_BENCH_DIR (1,000,000
// runs: run that first with FLOW_BENCH_DIR set). Not run in CI. docs/perf.md.
//
//	FLOW_BENCH_RUNS=1000000 FLOW_BENCH_DIR=/tmp/runs1m go test -run '^$' -bench QueryRuns ./checkpoint
//	FLOW_BENCH_DIR=/tmp/runs1m go test -run '^$' -bench RunsPage ./internal/webui
func BenchmarkRunsPage(b *testing.B) {
	dir := os.Getenv("FLOW_BENCH_DIR")
	if dir == "" {
		b.Skip("set FLOW_BENCH_DIR to a state checkpoint's BenchmarkQueryRuns built")
	}
	s, err := checkpoint.OpenStore(dir, checkpoint.StoreOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ui, err := New(Config{Backend: storeBackend{s}})
	if err != nil {
		b.Fatal(err)
	}
	defer ui.Close()
	for _, q := range []string{"", "?workflow=wf1", "?status=succeeded", "?workflow=wf1&status=failed", "?status=dead_lettered"} {
		b.Run("filter="+q, func(b *testing.B) {
			for b.Loop() {
				w := httptest.NewRecorder()
				ui.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/ui/"+q, nil))
				if w.Code != http.StatusOK || w.Body.Len() < 1000 {
					b.Fatalf("%d, %d bytes", w.Code, w.Body.Len())
				}
			}
		})
	}
}
