package checkpoint

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// walkQuery reads every page of q, each of a random size, and says how many pages it
// took.
func walkQuery(t *rapid.T, s *Store, q RunQuery) []Run {
	var out []Run
	for pages := 0; ; pages++ {
		if pages > 500 {
			t.Fatalf("%+v: more than 500 pages: the cursors do not move on", q)
		}
		q.Limit = rapid.IntRange(0, 6).Draw(t, "page size")
		page, next, err := s.QueryRuns(q)
		if err != nil {
			t.Fatalf("%+v: %v", q, err)
		}
		if want := queryLimit(q.Limit); len(page) > want {
			t.Fatalf("%+v: a page of %d runs for a limit of %d", q, len(page), want)
		}
		out = append(out, page...)
		if next == "" {
			return out
		}
		q.After = next
	}
}

// Property: over random logs (runs created at times out of log order, retried,
// cancelled, dead-lettered, purged and retired, with triggers and inputs), walking
// every page of QueryRuns with random page sizes and a small scan budget (so that
// pages end short at it) gives, for random filters (a time range, a workflow, statuses,
// a trigger, an input, top-level, either order), exactly the matching runs of a scan of
// the whole run table, each once, newest (or oldest) first by creation time.
func TestQueryRunsMatchesAScan(t *testing.T) {
	old := scanBudget
	t.Cleanup(func() { scanBudget = old })
	rapid.Check(t, func(t *rapid.T) {
		scanBudget = rapid.IntRange(1, 8).Draw(t, "budget")
		s, runs := randomRuns(t)
		defer s.Close()
		for range 8 {
			q := RunQuery{Oldest: rapid.Bool().Draw(t, "oldest"), TopLevel: rapid.Bool().Draw(t, "top-level")}
			if rapid.Bool().Draw(t, "ranged") {
				a := t0.Add(time.Duration(rapid.IntRange(-1, 41).Draw(t, "since")) * time.Minute)
				b := a.Add(time.Duration(rapid.IntRange(1, 20).Draw(t, "span")) * time.Minute)
				if rapid.Bool().Draw(t, "since set") {
					q.Since = a
				}
				if rapid.Bool().Draw(t, "until set") {
					q.Until = b
				}
			}
			if rapid.Bool().Draw(t, "by workflow") {
				q.Workflow = rapid.SampledFrom(append([]string{"nope"}, newestWorkflows...)).Draw(t, "workflow")
			}
			for _, st := range allStatuses {
				if rapid.IntRange(0, 3).Draw(t, "with status "+string(st)) == 0 {
					q.Statuses = append(q.Statuses, st)
				}
			}
			if rapid.Bool().Draw(t, "by trigger") {
				q.Trigger = rapid.SampledFrom([]string{TriggerManual, TriggerCron, TriggerRetry, TriggerBackfill}).Draw(t, "trigger")
			}
			if rapid.Bool().Draw(t, "by input") {
				q.Inputs = map[string]string{"k": rapid.SampledFrom([]string{"x", "y"}).Draw(t, "k")}
				if rapid.Bool().Draw(t, "by n") {
					q.Inputs["n"] = rapid.SampledFrom([]string{"1", "2", "3"}).Draw(t, "n")
				}
			}
			var want []Run
			for _, r := range runs {
				if q.matches(&r) {
					want = append(want, r)
				}
			}
			slices.SortFunc(want, func(a, b Run) int {
				c := cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.CreatedSeq, b.CreatedSeq), cmp.Compare(a.ID, b.ID))
				if q.Oldest {
					return c
				}
				return -c
			})
			got := walkQuery(t, s, q)
			if !slices.EqualFunc(got, want, func(a, b Run) bool { return a.ID == b.ID && a.CreatedSeq == b.CreatedSeq }) {
				t.Fatalf("%+v:\n got %v\nwant %v", q, ids(got), ids(want))
			}
		}
	})
}

func ids(runs []Run) []string {
	var out []string
	for _, r := range runs {
		out = append(out, fmt.Sprintf("%s@%s#%d", r.ID, r.CreatedAt.Format("15:04"), r.CreatedSeq))
	}
	return out
}

// The children and handler runs of one run, and top-level lists without them.
func TestQueryRunsOfAParent(t *testing.T) {
	s, err := OpenStore("state", StoreOptions{FS: memFS()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	apply := func(es ...Entry) {
		t.Helper()
		var datas [][]byte
		for _, e := range es {
			if e.At.IsZero() {
				e.At = t0
			}
			raw, _ := json.Marshal(e)
			datas = append(datas, raw)
		}
		verdicts, err := s.Apply(s.Applied()+1, EncodeJSONEnvelope("test", 3, datas))
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range verdicts {
			if v != nil {
				t.Fatalf("entry %d: %v", i, v)
			}
		}
	}
	sub := func(parent *ParentRef) *Submit {
		return &Submit{Workflow: "wf", Version: 1, Trigger: TriggerManual, MaxEpochs: 2, Steps: []StepSpec{{Name: "a"}}, Parent: parent}
	}
	apply(Entry{Kind: KindSubmit, Run: "p", Submit: sub(nil)}, Entry{Kind: KindSubmit, Run: "q", Submit: sub(nil), At: t0.Add(time.Minute)})
	apply(Entry{Kind: KindAssign, Run: "p", Term: 1, Worker: "w1"})
	p, _ := s.Run("p")
	for i := range 3 {
		c := sub(&ParentRef{Run: "p", Step: "a", Item: i})
		c.Trigger, c.Workflow = TriggerChild, "kid"
		apply(Entry{Kind: KindSubmit, Run: ChildID("p", "a", i), Epoch: p.Epoch, Owner: "w1", Submit: c, At: t0.Add(time.Duration(i+2) * time.Minute)})
	}
	list := func(q RunQuery) []string {
		t.Helper()
		runs, next, err := s.QueryRuns(q)
		if err != nil || next != "" {
			t.Fatalf("%+v: next %q, %v", q, next, err)
		}
		var out []string
		for _, r := range runs {
			out = append(out, r.ID)
		}
		return out
	}
	if got, want := list(RunQuery{Parent: "p"}), []string{"p.a.2", "p.a.1", "p.a.0"}; !slices.Equal(got, want) {
		t.Fatalf("children of p: %v, want %v", got, want)
	}
	page, next, err := s.QueryRuns(RunQuery{Parent: "p", Oldest: true, Limit: 2})
	if err != nil || len(page) != 2 || page[0].ID != "p.a.0" || page[1].ID != "p.a.1" || next == "" {
		t.Fatalf("children of p, oldest, 2 a page: %v, next %q, %v", ids(page), next, err)
	}
	if got, want := list(RunQuery{Parent: "p", Oldest: true, Limit: 2, After: next}), []string{"p.a.2"}; !slices.Equal(got, want) {
		t.Fatalf("children of p, oldest, second page: %v, want %v", got, want)
	}
	if got, want := list(RunQuery{TopLevel: true}), []string{"q", "p"}; !slices.Equal(got, want) {
		t.Fatalf("top-level: %v, want %v", got, want)
	}
	if got := list(RunQuery{}); len(got) != 5 || got[0] != "p.a.2" {
		t.Fatalf("every run: %v", got)
	}
	if _, _, err := s.QueryRuns(RunQuery{Parent: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("children of a run that does not exist: %v", err)
	}
}

// Bad filters and cursors are refused with what to pass.
func TestQueryRunsRefusesBadInput(t *testing.T) {
	s, err := OpenStore("state", StoreOptions{FS: memFS()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, q := range []RunQuery{
		{Statuses: []RunStatus{"done"}},
		{Trigger: "timer"},
		{Workflow: "Bad Name"},
		{Parent: "a/b"},
		{Since: t0, Until: t0},
		{After: "zz"},
		{After: "00"},
	} {
		if _, _, err := s.QueryRuns(q); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%+v: %v, want ErrInvalidEntry", q, err)
		}
	}
}
