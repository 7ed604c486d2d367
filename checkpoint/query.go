package checkpoint

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"
)

// RunView is everything the state knows about one run.
type RunView struct {
	Run    Run        `json:"run"`
	Steps  []StepView `json:"steps"`
	Fenced []Fenced   `json:"fenced"`
	Events []Event    `json:"events"`
}

// StepView is a step with its foreach items' checkpoints.
type StepView struct {
	Step
	ItemCheckpoints []Item `json:"item_checkpoints,omitempty"`
}

// Run returns a run's record, or an error wrapping ErrNotFound.
func (s *Store) Run(id string) (*Run, error) {
	var r Run
	found, err := s.getJSON(keyRun(id), &r)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &NotFoundError{What: "run", Name: id}
	}
	return &r, nil
}

// Status returns a run's status from the status index, without decoding the run.
func (s *Store) Status(id string) (RunStatus, error) {
	for _, st := range []RunStatus{StatusSucceeded, StatusFailed, StatusCancelled, StatusDeadLettered, StatusRunning, StatusPending, StatusWaiting} {
		_, closer, err := s.db.Get(keyByStatus(st, id))
		if err == nil {
			closer.Close()
			return st, nil
		}
		if !errors.Is(err, pebble.ErrNotFound) {
			return "", fmt.Errorf("checkpoint: read status of %q: %w", id, err)
		}
	}
	return "", &NotFoundError{What: "run", Name: id}
}

// View returns a run with its steps, item checkpoints, fenced commits and events.
func (s *Store) View(id string) (*RunView, error) {
	// One snapshot, so that the parts agree with each other.
	snap := s.db.NewSnapshot()
	defer snap.Close()
	var r Run
	found, err := getJSON(snap, keyRun(id), &r)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &NotFoundError{What: "run", Name: id}
	}
	v := &RunView{Run: r}
	for _, name := range r.Steps {
		var sv StepView
		if _, err := getJSON(snap, keyStep(id, name), &sv.Step); err != nil {
			return nil, err
		}
		if sv.Foreach {
			if sv.ItemCheckpoints, err = scanJSON[Item](snap, prefixItems(id, name)); err != nil {
				return nil, err
			}
		}
		v.Steps = append(v.Steps, sv)
	}
	if v.Fenced, err = scanJSON[Fenced](snap, prefixFenced(id)); err != nil {
		return nil, err
	}
	if v.Events, err = scanJSON[Event](snap, prefixEvents(id)); err != nil {
		return nil, err
	}
	// Accepted item commits are stored only as items; put them into the history.
	for _, sv := range v.Steps {
		for _, it := range sv.ItemCheckpoints {
			v.Events = append(v.Events, Event{Seq: it.Seq, Index: it.Entry, Kind: KindCommit, Epoch: it.Epoch,
				Owner: it.Owner, Step: sv.Name, Item: it.Index, Outcome: "accepted", At: it.At})
		}
	}
	slices.SortFunc(v.Events, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Index, b.Index))
	})
	return v, nil
}

// Steps returns a run's steps in workflow order, without items.
func (s *Store) Steps(id string) ([]Step, error) {
	r, err := s.Run(id)
	if err != nil {
		return nil, err
	}
	out := make([]Step, 0, len(r.Steps))
	for _, name := range r.Steps {
		var st Step
		if _, err := s.getJSON(keyStep(id, name), &st); err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// Items returns the checkpoints of a foreach step's items, by index.
func (s *Store) Items(run, step string) ([]Item, error) {
	return scanJSON[Item](s.db, prefixItems(run, step))
}

// ListOptions select runs. Runs come in run ID order; page with After.
type ListOptions struct {
	Workflow string    // "" for every workflow
	Status   RunStatus // "" for every status
	After    string    // the last run ID of the previous page
	Limit    int       // 0 means 100
}

// ListRuns returns runs matching opts and the cursor of the next page ("" at the end).
func (s *Store) ListRuns(opts ListOptions) ([]Run, string, error) {
	if opts.Status != "" && !ValidRunStatus(opts.Status) {
		return nil, "", fmt.Errorf("%w: status %q: use pending, running, succeeded, failed, cancelled or dead_lettered", ErrInvalidEntry, opts.Status)
	}
	limit := opts.Limit
	if limit <= 0 {
		limit = 100
	}
	// Without a status, walk the run table (filtering by workflow); with one, an index.
	var prefix []byte
	switch {
	case opts.Status == "":
		prefix = []byte("r/")
	case opts.Workflow != "":
		prefix = keyByWorkflow(opts.Workflow, opts.Status, "")
	default:
		prefix = keyByStatus(opts.Status, "")
	}
	var from []byte
	if opts.After != "" {
		from = append(append([]byte(nil), prefix...), opts.After...)
		from = append(from, 0) // strictly after
	}
	var runs []Run
	more := false
	err := scan(s.db, prefix, from, func(k, _ []byte) (bool, error) {
		if len(runs) == limit {
			more = true
			return false, nil
		}
		id := strings.TrimPrefix(string(k), string(prefix))
		r, err := s.Run(id)
		if err != nil {
			return false, err
		}
		if opts.Workflow != "" && r.Workflow != opts.Workflow {
			return true, nil
		}
		runs = append(runs, *r)
		return true, nil
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if more && len(runs) > 0 {
		next = runs[len(runs)-1].ID
	}
	return runs, next, nil
}

// EachRun calls fn for every run matching opts (Limit is the page size; After where to
// start), page by page, until fn returns false or ctx's work is done. The runs are read
// page by page, so fn may write to the log meanwhile.
func (s *Store) EachRun(opts ListOptions, fn func(*Run) bool) error {
	if opts.Limit <= 0 {
		opts.Limit = 256
	}
	for {
		runs, next, err := s.ListRuns(opts)
		if err != nil {
			return err
		}
		for i := range runs {
			if !fn(&runs[i]) {
				return nil
			}
		}
		if next == "" {
			return nil
		}
		opts.After = next
	}
}

// CountRuns counts the runs in a status from the status index, without reading them.
func (s *Store) CountRuns(status RunStatus) (int, error) {
	n := 0
	err := scan(s.db, keyByStatus(status, ""), nil, func(_, _ []byte) (bool, error) {
		n++
		return true, nil
	})
	return n, err
}

// Ticks returns the recorded cron ticks of a workflow, oldest first.
func (s *Store) Ticks(workflow string) ([]Tick, error) {
	return scanJSON[Tick](s.db, prefixTicks(workflow))
}

// StaleTerms returns the scheduler entries rejected for their term, in log order.
func (s *Store) StaleTerms() ([]StaleTerm, error) {
	return scanJSON[StaleTerm](s.db, []byte("t/"))
}

// Workflow returns a version of a workflow; version 0 means the latest.
func (s *Store) Workflow(name string, version int) (*WorkflowVersion, error) {
	if version == 0 {
		if w, ok := s.latest.Load(name); ok {
			c := *w.(*WorkflowVersion)
			return &c, nil
		}
		w, err := latestWorkflow(s.db, name)
		if err == nil && w == nil {
			err = &NotFoundError{What: "workflow", Name: name}
		}
		if err != nil {
			return nil, err
		}
		cached, _ := s.latest.LoadOrStore(name, w)
		c := *cached.(*WorkflowVersion)
		return &c, nil
	}
	var w WorkflowVersion
	found, err := s.getJSON(keyWorkflow(name, version), &w)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, &NotFoundError{What: "workflow", Name: name, Version: version}
	}
	return &w, nil
}

// Workflows returns the latest version of every workflow, by name.
func (s *Store) Workflows() ([]WorkflowVersion, error) {
	all, err := scanJSON[WorkflowVersion](s.db, []byte("v/"))
	if err != nil {
		return nil, err
	}
	var out []WorkflowVersion
	for i, w := range all {
		if i+1 == len(all) || all[i+1].Name != w.Name {
			out = append(out, w)
		}
	}
	return out, nil
}

func latestWorkflow(r pebble.Reader, name string) (*WorkflowVersion, error) {
	var latest *WorkflowVersion
	it, err := r.NewIter(&pebble.IterOptions{LowerBound: prefixWorkflow(name), UpperBound: prefixEnd(prefixWorkflow(name))})
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read workflow %q: %w: %w", name, ErrStorage, err)
	}
	defer it.Close()
	if it.Last() {
		latest = &WorkflowVersion{}
		if err := json.Unmarshal(it.Value(), latest); err != nil {
			return nil, fmt.Errorf("checkpoint: decode workflow %q: %w: %w", name, ErrStorage, err)
		}
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("checkpoint: read workflow %q: %w: %w", name, ErrStorage, err)
	}
	return latest, nil
}
