package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/flowrun/flow/internal/base/ident"
)

// Runs by creation time (run list and the web UI list runs newest first, in a time range,
// a page at a time, over a million runs). Run IDs are chosen by users and say nothing of
// time, so the r/, x/ and w/ tables, ordered by ID, cannot give the newest runs without
// reading all of them. Three indexes are ordered by the run's creation position: its
// creation time (Run.CreatedAt, the submit's time, Unix nanoseconds), then its submit
// sequence (one message may submit several runs), then its ID, 8 + 8 bytes big-endian,
// so that an iterator walks a time range from either end and a page is one seek plus the
// runs it looks at, however deep (listing.go):
//
//	b/<at:8><seq:8><run>              every run
//	d/<at:8><seq:8><run>              top-level runs (no parent, not a handler run)
//	g/<workflow>/<at:8><seq:8><run>   by workflow
//
// Their values are empty: the run's record is read from r/. A run's creation position
// never changes, so the applier writes its keys once, when it creates the run, and
// deletes them where it deletes a retired run's keys; a status change writes nothing here.
//
// m/index-newest-2 holds the applied sequence they are current at, written in every batch
// that moves m/applied. A state written by an older flowd (before these indexes, with
// the seq-ordered n/ o/ p/ q/ ones that served the UI, whose m/index-newest it kept; or
// after a downgrade that applied messages without them) has it missing or behind, and
// OpenStore then rebuilds them from the run table, clearing the old ones.
var keyNewestAt = []byte("m/index-newest-2")

// The creation-time tables, each a one-letter table like the others (state.go), and the
// tables an older flowd kept that a rebuild clears (n/ o/ p/ q/: by submit sequence, and
// by status, workflow and both).
var (
	newestTables  = [][]byte{[]byte("b/"), []byte("d/"), []byte("g/")}
	droppedTables = [][]byte{[]byte("n/"), []byte("o/"), []byte("p/"), []byte("q/")}
)

// setNewestCreated writes the keys of a run just created.
func setNewestCreated(b *pebble.Batch, r *Run) {
	for _, k := range createdKeys(r) {
		_ = b.Set(k, nil, nil)
	}
}

// deleteNewest deletes a retired run's keys. Point deletes, like the rest of deleteRun's.
func deleteNewest(b *pebble.Batch, r *Run) {
	for _, k := range createdKeys(r) {
		_ = b.Delete(k, nil)
	}
}

// Page sizes of QueryRuns and RunsWithIDPrefix.
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

// ensureNewestIndex builds the creation-time indexes if they are not current at the
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
			return fmt.Errorf("checkpoint: build the creation-time index: %w: %w", ErrStorage, err)
		}
		_ = b.Close()
		b = s.db.NewBatch()
		return nil
	}
	// Keys an older flowd left stale (it applied without moving them), and its dropped
	// tables: point deletes, which later reads do not pay for as they pay for range
	// deletions (decisions.md).
	for _, table := range append(append([][]byte{}, newestTables...), droppedTables...) {
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
			Workflow   string      `json:"workflow"`
			CreatedSeq uint64      `json:"created_seq"`
			CreatedAt  time.Time   `json:"created_at"`
			Parent     *ParentRef  `json:"parent"`
			Handler    *HandlerRef `json:"handler"`
		}
		if err := json.Unmarshal(v, &f); err != nil {
			return false, fmt.Errorf("checkpoint: decode %q: %w: %w (the state is corrupt; move it aside and let flowd replay the log)", k, ErrStorage, err)
		}
		r := &Run{ID: string(k[len("r/"):]), Workflow: f.Workflow, CreatedSeq: f.CreatedSeq, CreatedAt: f.CreatedAt, Parent: f.Parent, Handler: f.Handler}
		setNewestCreated(b, r)
		return true, flush()
	})
	if err != nil {
		return err
	}
	_ = b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, applied), nil)
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("checkpoint: build the creation-time index: %w: %w", ErrStorage, err)
	}
	return nil
}
