package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/flowrun/flow/internal/base/ident"
)

// Runs by creation time: `flowctl run list` and the UI's runs page (newest first unless
// asked otherwise, a time range, a cursor, filters). The b/, d/ and g/ indexes (newest.go)
// hold every run, the top-level runs and each workflow's runs under their creation
// position, so a time range is the bounds of one seek and a page costs the runs it
// looks at, not the runs the state holds.
//
// Filters that no index serves (statuses, trigger, inputs; the top-level rule within a
// workflow) are checked on each run's record. A query looks at most scanBudget index
// entries: when it stops there with fewer runs than its limit, it returns what it found
// and a cursor to go on from (a short page that says "more may follow"), so no request
// walks a million runs to find three failed ones. Callers that want a full page (the
// CLI) ask again with the cursor.

// Triggers a run may have (Run.Trigger; `run list --trigger`).
var Triggers = []string{TriggerManual, TriggerCron, TriggerBackfill, TriggerRetry, TriggerEvent, TriggerChild, TriggerHandler}

// TriggerEvent is a run started by a message (a workflow's `on:` trigger).
const TriggerEvent = "event"

// RunQuery selects runs by creation time.
type RunQuery struct {
	Since, Until time.Time         // created at or after Since, before Until (zero: unbounded)
	Workflow     string            // only this workflow
	Statuses     []RunStatus       // only these statuses (none: any)
	Trigger      string            // only this trigger
	Inputs       map[string]string // only runs whose inputs have these values (as text)
	Parent       string            // only the children and handler runs of this run
	TopLevel     bool              // no child runs and no handler runs
	Oldest       bool              // oldest first (default: newest first)
	After        string            // the cursor a previous page returned
	Limit        int               // 0 means 50, at most 10,000
}

// scanBudget bounds the index entries one QueryRuns looks at.
var scanBudget = 20000

// queryLimit is a query's page size: 0 means 50, at most 10,000 (the API's bound).
func queryLimit(n int) int {
	if n <= 0 {
		return defaultPage
	}
	return min(n, 10000)
}

// createdKeys are a run's keys in the creation-time indexes.
func createdKeys(r *Run) [][]byte {
	pos := createdPos(r)
	keys := [][]byte{append([]byte("b/"), pos...), append([]byte("g/"+r.Workflow+"/"), pos...)}
	if r.Parent == nil && r.Handler == nil {
		keys = append(keys, append([]byte("d/"), pos...))
	}
	return keys
}

// createdPos is a run's creation position: its creation time (Unix nanoseconds, 8 bytes;
// a time before 1970, which no submit has, as 0), its submit sequence, its ID.
func createdPos(r *Run) []byte {
	return append(binary.BigEndian.AppendUint64(timeKey(r.CreatedAt), r.CreatedSeq), r.ID...)
}

func timeKey(t time.Time) []byte {
	n := uint64(0)
	if !t.IsZero() && t.UnixNano() > 0 {
		n = uint64(t.UnixNano())
	}
	return binary.BigEndian.AppendUint64(make([]byte, 0, 16), n)
}

// ValidTrigger says whether t is a trigger a run may have.
func ValidTrigger(t string) bool { return slices.Contains(Triggers, t) }

func (q *RunQuery) check() error {
	for _, st := range q.Statuses {
		if !ValidRunStatus(st) {
			return fmt.Errorf("%w: status %q: use pending, running, waiting, succeeded, failed, cancelled or dead_lettered", ErrInvalidEntry, st)
		}
	}
	if q.Workflow != "" && !ident.ValidName(q.Workflow) {
		return fmt.Errorf("%w: workflow %q: a workflow name is 1-64 of a-z, 0-9, '_' or '-'", ErrInvalidEntry, q.Workflow)
	}
	if q.Trigger != "" && !ValidTrigger(q.Trigger) {
		return fmt.Errorf("%w: trigger %q: use one of %v", ErrInvalidEntry, q.Trigger, Triggers)
	}
	if q.Parent != "" && !ident.ValidID(q.Parent) {
		return fmt.Errorf("%w: parent %q is not a run ID: %s", ErrInvalidEntry, q.Parent, ident.IDRule)
	}
	if !q.Since.IsZero() && !q.Until.IsZero() && !q.Since.Before(q.Until) {
		return fmt.Errorf("%w: since %s is not before until %s: give a range whose start comes first", ErrInvalidEntry, q.Since.Format(time.RFC3339), q.Until.Format(time.RFC3339))
	}
	return nil
}

// matches says whether r passes the filters no index served.
func (q *RunQuery) matches(r *Run) bool {
	if len(q.Statuses) > 0 && !slices.Contains(q.Statuses, r.Status) {
		return false
	}
	if q.Trigger != "" && r.Trigger != q.Trigger {
		return false
	}
	if q.TopLevel && (r.Parent != nil || r.Handler != nil) {
		return false
	}
	if q.Workflow != "" && r.Workflow != q.Workflow {
		return false
	}
	if !q.Since.IsZero() && r.CreatedAt.Before(q.Since) || !q.Until.IsZero() && !r.CreatedAt.Before(q.Until) {
		return false
	}
	if len(q.Inputs) > 0 {
		var in map[string]any
		if len(r.Inputs) == 0 || json.Unmarshal(r.Inputs, &in) != nil {
			return false
		}
		for k, want := range q.Inputs {
			v, ok := in[k]
			if !ok || inputText(v) != want {
				return false
			}
		}
	}
	return true
}

// inputText is an input's value as `--input K=V` gives it: a string as it is, anything
// else as its JSON.
func inputText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// QueryRuns returns a page of the runs q selects, newest first (oldest with q.Oldest),
// and the cursor of the next page ("" when no run is left to look at). A page holds
// fewer than the limit when the query's look ended at its budget; its cursor goes on
// from there.
func (s *Store) QueryRuns(q RunQuery) ([]Run, string, error) {
	if err := q.check(); err != nil {
		return nil, "", err
	}
	limit := queryLimit(q.Limit)
	var after []byte
	if q.After != "" {
		pos, err := decodeCursor(q.After)
		if err != nil {
			return nil, "", err
		}
		after = pos
	}
	snap := s.db.NewSnapshot()
	defer snap.Close()
	if q.Parent != "" {
		return queryChildren(snap, q, after, limit)
	}
	var prefix []byte
	switch {
	case q.Workflow != "":
		prefix = []byte("g/" + q.Workflow + "/")
	case q.TopLevel:
		prefix = []byte("d/")
	default:
		prefix = []byte("b/")
	}
	lower, upper := slices.Clip(prefix), prefixEnd(prefix)
	if !q.Since.IsZero() {
		lower = append(slices.Clip(prefix), timeKey(q.Since)...)
	}
	if !q.Until.IsZero() {
		upper = append(slices.Clip(prefix), timeKey(q.Until)...)
	}
	if after != nil {
		k := append(slices.Clip(prefix), after...)
		if q.Oldest {
			lower = maxKey(lower, append(k, 0)) // strictly after the cursor
		} else {
			upper = minKey(upper, k) // the bound is exclusive
		}
	}
	if bytes.Compare(lower, upper) >= 0 {
		return []Run{}, "", nil
	}
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint: list runs: %w: %w", ErrStorage, err)
	}
	defer it.Close()
	first, step := it.Last, it.Prev
	if q.Oldest {
		first, step = it.First, it.Next
	}
	runs := make([]Run, 0, min(limit, 64))
	var last []byte
	next, looked := "", 0
	for ok := first(); ok; ok = step() {
		pos := it.Key()[len(prefix):]
		if len(pos) < 17 {
			return nil, "", fmt.Errorf("checkpoint: index key %q is corrupt: %w (move the state aside and let flowd replay the log)", it.Key(), ErrStorage)
		}
		if len(runs) == limit || looked == scanBudget {
			next = hex.EncodeToString(last) // more may follow: go on after the last one looked at
			break
		}
		looked++
		last = append(last[:0], pos...)
		id := string(pos[16:])
		var r Run
		found, err := getJSON(snap, keyRun(id), &r)
		if err != nil {
			return nil, "", err
		}
		if !found {
			return nil, "", fmt.Errorf("checkpoint: index key %q names run %q, which has no record: %w (move the state aside and let flowd replay the log)", it.Key(), id, ErrStorage)
		}
		if q.matches(&r) {
			runs = append(runs, r)
		}
	}
	if err := it.Error(); err != nil {
		return nil, "", fmt.Errorf("checkpoint: list runs: %w: %w", ErrStorage, err)
	}
	return runs, next, nil
}

// queryChildren answers a query for one run's children and handler runs from the
// parent's record (at most MaxChildren, and its handler runs), in creation order.
func queryChildren(snap *pebble.Snapshot, q RunQuery, after []byte, limit int) ([]Run, string, error) {
	var p Run
	found, err := getJSON(snap, keyRun(q.Parent), &p)
	if err != nil {
		return nil, "", err
	}
	if !found {
		return nil, "", &NotFoundError{What: "run", Name: q.Parent}
	}
	type placed struct {
		pos []byte
		run Run
	}
	var all []placed
	for _, id := range append(slices.Clone(p.Children), p.HandlerRuns...) {
		var r Run
		found, err := getJSON(snap, keyRun(id), &r)
		if err != nil {
			return nil, "", err
		}
		if !found || !q.matches(&r) {
			continue // retired, or filtered out
		}
		all = append(all, placed{createdPos(&r), r})
	}
	slices.SortFunc(all, func(a, b placed) int {
		if q.Oldest {
			return bytes.Compare(a.pos, b.pos)
		}
		return bytes.Compare(b.pos, a.pos)
	})
	runs := make([]Run, 0, min(limit, len(all)))
	next := ""
	for _, x := range all {
		if after != nil && (q.Oldest && bytes.Compare(x.pos, after) <= 0 || !q.Oldest && bytes.Compare(x.pos, after) >= 0) {
			continue
		}
		if len(runs) == limit {
			next = hex.EncodeToString(createdPos(&runs[len(runs)-1]))
			break
		}
		runs = append(runs, x.run)
	}
	return runs, next, nil
}

// decodeCursor checks a cursor of QueryRuns: the hex of a creation position (8
// bytes of time, 8 of sequence, a run ID). It comes from clients: a malformed one is an
// error that says what to pass.
func decodeCursor(c string) ([]byte, error) {
	pos, err := hex.DecodeString(c)
	if err != nil || len(pos) < 17 || !ident.ValidID(string(pos[16:])) {
		shown := c
		if len(shown) > 80 {
			shown = shown[:80] + "..."
		}
		return nil, fmt.Errorf("%w: cursor %q is not one run list returned: pass the token printed after \"more: --after\" unchanged, or none for the first page", ErrInvalidEntry, shown)
	}
	return pos, nil
}

func maxKey(a, b []byte) []byte {
	if bytes.Compare(a, b) >= 0 {
		return a
	}
	return b
}

func minKey(a, b []byte) []byte {
	if bytes.Compare(a, b) <= 0 {
		return a
	}
	return b
}
