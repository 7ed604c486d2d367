package checkpoint

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2"

	"github.com/flowrun/flow/internal/base/ident"
)

// Runs newest first (the web UI lists runs that way, filtered by workflow
// and/or status, a page at a time, over a million runs). Run IDs are chosen by users and
// say nothing of time, so the r/, x/ and w/ tables, ordered by ID, cannot give the newest
// runs without reading all of them. Four more indexes are ordered by the run's submit
// sequence (Run.CreatedSeq, then the ID: one message may submit several runs), as 8
// big-endian bytes, so that an iterator from the end of a prefix walks newest first and
// a page is one seek plus its runs, however deep:
//
//	n/<seq:8><run>                       every run
//	o/<status>/<seq:8><run>              by status
//	p/<workflow>/<seq:8><run>            by workflow
//	q/<workflow>/<status>/<seq:8><run>   by workflow and status
//
// Their values are empty: the run's record is read from r/. The applier writes n/ and p/
// when it creates a run, moves o/ and q/ where it moves x/ and w/, and deletes all four
// where it deletes a retired run's keys.
//
// m/index-newest holds the applied sequence they are current at, written in every batch
// that moves m/applied. A state written by an older flowd (before the indexes, or after
// a downgrade that applied messages without them) has it missing or behind, and
// OpenStore then rebuilds them from the run table.
var keyNewestAt = []byte("m/index-newest")

// The newest-first tables, each a one-letter table like the others (state.go).
var newestTables = [][]byte{[]byte("n/"), []byte("o/"), []byte("p/"), []byte("q/")}

// newestPos is a run's place in the newest-first order: its submit sequence, then its ID.
func newestPos(seq uint64, run string) []byte {
	return append(binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(run)), seq), run...)
}

// newestPrefix is the prefix of the index that serves a filter.
func newestPrefix(workflow string, status RunStatus) []byte {
	switch {
	case workflow != "" && status != "":
		return []byte("q/" + workflow + "/" + string(status) + "/")
	case workflow != "":
		return []byte("p/" + workflow + "/")
	case status != "":
		return []byte("o/" + string(status) + "/")
	}
	return []byte("n/")
}

// newestKey is r's key in the index prefix names.
func newestKey(prefix []byte, r *Run) []byte {
	return append(prefix, newestPos(r.CreatedSeq, r.ID)...)
}

// setNewestCreated writes the status-free keys of a run just created.
func setNewestCreated(b *pebble.Batch, r *Run) {
	_ = b.Set(newestKey(newestPrefix("", ""), r), nil, nil)
	_ = b.Set(newestKey(newestPrefix(r.Workflow, ""), r), nil, nil)
}

// setNewestStatus writes (or, del, deletes) a run's keys for one status.
func setNewestStatus(b *pebble.Batch, r *Run, status RunStatus, del bool) {
	for _, k := range [][]byte{newestKey(newestPrefix("", status), r), newestKey(newestPrefix(r.Workflow, status), r)} {
		if del {
			_ = b.Delete(k, nil)
		} else {
			_ = b.Set(k, nil, nil)
		}
	}
}

// deleteNewest deletes a retired run's keys: the status-free ones and those of the
// statuses it may have (in Pebble and after this message). Point deletes, like the rest
// of deleteRun's.
func deleteNewest(b *pebble.Batch, r *Run, statuses ...RunStatus) {
	_ = b.Delete(newestKey(newestPrefix("", ""), r), nil)
	_ = b.Delete(newestKey(newestPrefix(r.Workflow, ""), r), nil)
	for _, st := range statuses {
		if st != "" {
			setNewestStatus(b, r, st, true)
		}
	}
}

// NewestOptions select a page of runs, newest first.
type NewestOptions struct {
	Workflow string    // "" for every workflow
	Status   RunStatus // "" for every status
	Before   string    // the cursor returned with the previous page; "" for the newest runs
	Limit    int       // the page size: 0 means 50, at most 1000
}

// Page sizes of RunsNewest and RunsWithIDPrefix.
const (
	defaultPage = 50
	maxPage     = 1000
)

func pageLimit(n int) int {
	if n <= 0 {
		return defaultPage
	}
	return min(n, maxPage)
}

// RunsNewest returns a page of the runs matching opts, newest (latest submitted) first,
// and the cursor of the next, older, page ("" when there is none). The cursor is a
// position, not a run: the page after it is right even if that run was retired meanwhile.
// A page is one seek in an index and a read of each of its runs, as fast on the
// thousandth page as on the first (docs/perf.md).
func (s *Store) RunsNewest(opts NewestOptions) ([]Run, string, error) {
	if opts.Status != "" && !ValidRunStatus(opts.Status) {
		return nil, "", fmt.Errorf("%w: status %q: use pending, running, succeeded, failed, cancelled or dead_lettered", ErrInvalidEntry, opts.Status)
	}
	if opts.Workflow != "" && !ident.ValidName(opts.Workflow) {
		return nil, "", fmt.Errorf("%w: workflow %q: a workflow name is 1-64 of a-z, 0-9, '_' or '-'", ErrInvalidEntry, opts.Workflow)
	}
	limit := pageLimit(opts.Limit)
	prefix := newestPrefix(opts.Workflow, opts.Status)
	upper := prefixEnd(prefix)
	if opts.Before != "" {
		pos, err := decodeCursor(opts.Before)
		if err != nil {
			return nil, "", err
		}
		// The cursor's key is the exclusive upper bound: the page starts just before it.
		upper = append(slices.Clip(prefix), pos...)
	}
	// One snapshot, so that the index and the records agree (the applier goes on).
	snap := s.db.NewSnapshot()
	defer snap.Close()
	it, err := snap.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: upper})
	if err != nil {
		return nil, "", fmt.Errorf("checkpoint: list runs: %w: %w", ErrStorage, err)
	}
	defer it.Close()
	runs := make([]Run, 0, min(limit, 64))
	var last []byte // the position of the page's last run
	next := ""
	for ok := it.Last(); ok; ok = it.Prev() {
		if len(runs) == limit {
			next = hex.EncodeToString(last) // one more run exists: there is a next page
			break
		}
		pos := it.Key()[len(prefix):]
		if len(pos) < 9 {
			return nil, "", fmt.Errorf("checkpoint: index key %q is corrupt: %w (move the state aside and let flowd replay the log)", it.Key(), ErrStorage)
		}
		id := string(pos[8:])
		var r Run
		found, err := getJSON(snap, keyRun(id), &r)
		if err != nil {
			return nil, "", err
		}
		if !found {
			return nil, "", fmt.Errorf("checkpoint: index key %q names run %q, which has no record: %w (move the state aside and let flowd replay the log)", it.Key(), id, ErrStorage)
		}
		runs = append(runs, r)
		last = append(last[:0], pos...)
	}
	if err := it.Error(); err != nil {
		return nil, "", fmt.Errorf("checkpoint: list runs: %w: %w", ErrStorage, err)
	}
	return runs, next, nil
}

// decodeCursor checks a cursor of RunsNewest and returns the position it holds: the hex
// of the last run's submit sequence (8 bytes) and ID. It comes back from clients, so a
// malformed one is an error that says what to pass, never a seek to garbage.
func decodeCursor(c string) ([]byte, error) {
	pos, err := hex.DecodeString(c)
	if err != nil || len(pos) < 9 || !ident.ValidID(string(pos[8:])) {
		shown := c
		if len(shown) > 80 {
			shown = shown[:80] + "..."
		}
		return nil, fmt.Errorf("%w: cursor %q is not one this store returned: pass the cursor that came with the previous page unchanged, or none for the newest runs", ErrInvalidEntry, shown)
	}
	return pos, nil
}

// RunsWithIDPrefix returns the runs whose ID starts with prefix, in ID order, at most
// limit of them (0 means 50, at most 1000): the web UI's search by ID. A prefix that no
// run ID can start with (ident.IDRule) is an error rather than an empty answer, so that
// a mistyped search says why it finds nothing.
func (s *Store) RunsWithIDPrefix(prefix string, limit int) ([]Run, error) {
	// A prefix can end in '.' ("a." starts "a.b") but not be one itself: prefix+"0" is a
	// valid ID exactly when something valid can follow it.
	if prefix != "" && !ident.ValidID(prefix) && !ident.ValidID(prefix+"0") {
		return nil, fmt.Errorf("%w: no run ID starts with %q: %s", ErrInvalidEntry, prefix, ident.IDRule)
	}
	limit = pageLimit(limit)
	runs := make([]Run, 0, min(limit, 64))
	err := scan(s.db, keyRun(prefix), nil, func(k, v []byte) (bool, error) {
		var r Run
		if err := json.Unmarshal(v, &r); err != nil {
			return false, fmt.Errorf("checkpoint: decode %q: %w: %w (the state is corrupt; move it aside and let flowd replay the log)", k, ErrStorage, err)
		}
		runs = append(runs, r)
		return len(runs) < limit, nil
	})
	if err != nil {
		return nil, err
	}
	return runs, nil
}

// indexBuildBatch is how many keys one batch of an index build writes: a batch is held
// in memory until it commits. A variable so that a test can make builds of many batches.
var indexBuildBatch = 32 << 10

// ensureNewestIndex builds the newest-first indexes if they are not current at the
// applied sequence (a state written by an older flowd; m/index-newest says so): it
// clears what the tables hold, writes every run's keys from the run table, and sets
// m/index-newest in the last batch, so that a build cut short by a crash is done again
// at the next open. Run at open, before the applier starts.
func (s *Store) ensureNewestIndex(applied uint64) error {
	at, found, err := s.getUintFound(keyNewestAt)
	if err != nil {
		return err
	}
	if found && at == applied {
		return nil
	}
	b := s.db.NewBatch()
	defer func() { _ = b.Close() }()
	flush := func() error {
		if b.Count() < uint32(indexBuildBatch) {
			return nil
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return fmt.Errorf("checkpoint: build the newest-first index: %w: %w", ErrStorage, err)
		}
		_ = b.Close()
		b = s.db.NewBatch()
		return nil
	}
	// Keys an older flowd left stale (it applied without moving them): point deletes,
	// which later reads do not pay for as they pay for range deletions (decisions.md).
	for _, table := range newestTables {
		if err := scan(s.db, table, nil, func(k, _ []byte) (bool, error) {
			_ = b.Delete(k, nil)
			return true, flush()
		}); err != nil {
			return err
		}
	}
	err = scan(s.db, []byte("r/"), nil, func(k, v []byte) (bool, error) {
		// Only what the keys need: a run's JSON holds its spec and epochs too.
		var f struct {
			Workflow   string    `json:"workflow"`
			Status     RunStatus `json:"status"`
			CreatedSeq uint64    `json:"created_seq"`
		}
		if err := json.Unmarshal(v, &f); err != nil {
			return false, fmt.Errorf("checkpoint: decode %q: %w: %w (the state is corrupt; move it aside and let flowd replay the log)", k, ErrStorage, err)
		}
		r := &Run{ID: string(k[len("r/"):]), Workflow: f.Workflow, CreatedSeq: f.CreatedSeq}
		setNewestCreated(b, r)
		setNewestStatus(b, r, f.Status, false)
		return true, flush()
	})
	if err != nil {
		return err
	}
	_ = b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, applied), nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("checkpoint: build the newest-first index: %w: %w", ErrStorage, err)
	}
	return nil
}
