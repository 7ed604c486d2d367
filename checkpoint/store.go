package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/flowrun/flow/internal/base/testhooks"
)

// DefaultMaxEpochs is used for a run submitted without max_epochs.
const DefaultMaxEpochs = 5

// formatVersion is pinned so that an upgrade of Pebble never silently rewrites the
// data dir into a format an older flowd cannot open (docs/decisions.md).
const formatVersion = pebble.FormatValueSeparation

// StoreOptions configure a Store.
type StoreOptions struct {
	// FS is the file system; nil means the real disk. Tests may pass vfs.NewMem():
	// still the real Pebble, without the disk.
	FS vfs.FS
	// Hooks are tests' switches (internal/base/testhooks): the store's guards off, for the
	// negative controls. Nil in production.
	Hooks *testhooks.Hooks
	// OnStatus, if set, is called after each applied message for every run whose
	// status it changed, from the applier's goroutine: it must not block.
	OnStatus func(run string, status RunStatus)
	// ReadFormat, if set, makes the store read log formats up to it only, as the release
	// that read that much did (tests of mixed clusters; 0: this binary's, MaxReadFormat).
	ReadFormat int
}

// Store is one node's Pebble copy of the run state, built by applying the log.
// Apply must be called from one goroutine at a time (the consumer); queries may
// run concurrently with it.
type Store struct {
	db       *pebble.DB
	hooks    *testhooks.Hooks
	onStatus func(run string, status RunStatus)

	closeOnce sync.Once
	closeErr  error

	counters Counters

	applyMu sync.Mutex            // serialises Apply and ApplyIfNext; guards runs
	runs    map[string]*cachedRun // decoded runs recently applied to
	applied atomic.Uint64
	term    atomic.Int64
	// clusterVersion is the applied cluster version: the log format writers use
	// (cluster.go). reader is what this store reads (this binary's, unless
	// StoreOptions.ReadFormat says older).
	clusterVersion atomic.Int64
	reader         reader

	// latest caches each workflow's latest version (name -> *WorkflowVersion): every
	// StartRun asks for it, and reading it from Pebble was an iterator and a decode.
	// The applier overwrites an entry after the batch that made a new version commits;
	// readers fill it with LoadOrStore, so a reader's older value never replaces it.
	latest sync.Map

	schedMu sync.Mutex
	sched   chan struct{} // closed (and replaced) when a workflow version or cron tick is applied

	// queue holds the runs that need an assign (Run.NeedsAssign), in submission order,
	// and those holding an epoch (queue.go): built at open, kept by the applier after
	// each commit. The scheduler looks for such runs after every applied message, and
	// decoding every pending run to find them was a sixth of W1's CPU.
	queue runQueue
	// missed counts deadline misses by workflow (operations.go).
	missedMu sync.Mutex
	missed   map[string]int64
}

// OpenStore opens (or creates) the state in dir.
func OpenStore(dir string, opts StoreOptions) (*Store, error) {
	popts := &pebble.Options{
		FormatMajorVersion: formatVersion,
		Logger:             quietLogger{},
		Cache:              pebble.NewCache(64 << 20),
	}
	defer popts.Cache.Unref()
	// Bloom filters: every commit asks whether its (step, item) already has a
	// checkpoint, and the answer is almost always no; without filters each such miss
	// reads index and data blocks of every level.
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if opts.FS != nil {
		popts.FS = opts.FS
	}
	db, err := pebble.Open(dir, popts)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open state in %s: %w", dir, err)
	}
	s := &Store{db: db, hooks: testhooks.OrProduction(opts.Hooks), onStatus: opts.OnStatus, runs: map[string]*cachedRun{}, reader: thisBinary}
	if opts.ReadFormat > 0 && opts.ReadFormat < thisBinary.format {
		s.reader = readerOf(opts.ReadFormat)
	}
	applied, err := s.getUint(keyApplied)
	if err != nil {
		db.Close()
		return nil, err
	}
	term, err := s.getUint(keyTerm)
	if err != nil {
		db.Close()
		return nil, err
	}
	version, err := s.getUint(keyClusterVersion)
	if err != nil {
		db.Close()
		return nil, err
	}
	if err := s.ensureNewestIndex(applied); err != nil {
		db.Close()
		return nil, err
	}
	s.applied.Store(applied)
	s.term.Store(int64(term))
	s.clusterVersion.Store(max(int64(version), 1))
	s.queue.init()
	// Parked runs too: they hold their keys' slots, and those parked for step slots
	// wait for the leader's grant (slots.go).
	for _, st := range []RunStatus{StatusPending, StatusRunning, StatusWaiting} {
		if err := s.EachRun(ListOptions{Status: st}, func(r *Run) bool {
			s.noteQueue(r)
			return true
		}); err != nil {
			db.Close()
			return nil, fmt.Errorf("checkpoint: read %s runs: %w", st, err)
		}
	}
	return s, nil
}

// noteQueue records whether r needs an assign or holds an epoch, after r's state
// changed.
func (s *Store) noteQueue(r *Run) { s.queue.note(r) }

// Close closes the store. Safe to call twice.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.db.Close() })
	return s.closeErr
}

// Counters count what this node's applier decided since it started.
type Counters struct {
	CommitsAccepted atomic.Int64
	CommitsFenced   atomic.Int64 // commits (and fails, completes) rejected for their epoch or a checkpoint
	EpochChanges    atomic.Int64 // new epochs given by assigns
	StaleTerms      atomic.Int64 // scheduler entries rejected for their term
	DeadLettered    atomic.Int64
	LogRejected     atomic.Int64 // log messages that could not be decoded, recorded as rejected
	Retired         atomic.Int64 // runs removed at the end of their retention
}

// Counters returns the applier's counters.
func (s *Store) Counters() *Counters { return &s.counters }

// Applied is the last log sequence applied to this store.
func (s *Store) Applied() uint64 { return s.applied.Load() }

// HighestTerm is the highest leader term applied.
func (s *Store) HighestTerm() int64 { return s.term.Load() }

func (s *Store) getUint(key []byte) (uint64, error) {
	v, _, err := s.getUintFound(key)
	return v, err
}

// getUintFound is getUint that also tells a missing key from a zero.
func (s *Store) getUintFound(key []byte) (uint64, bool, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("checkpoint: read %s: %w", key, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, false, fmt.Errorf("checkpoint: %s holds %d bytes, want 8: the state is corrupt; move the data dir's state aside and let flowd replay the log", key, len(v))
	}
	return binary.BigEndian.Uint64(v), true, nil
}

// Apply applies one log message (a batch of entries) at sequence seq, in one Pebble
// batch together with the applied sequence. It returns each entry's verdict: nil if
// accepted, else why it was rejected (errors.Is it with ErrFenced, ErrStaleTerm, ...).
// A message that cannot be decoded returns a *CorruptError and changes nothing.
// A sequence at or below the applied one is skipped with nil verdicts (replay is
// idempotent).
func (s *Store) Apply(seq uint64, data []byte) ([]error, error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if seq <= s.applied.Load() {
		return nil, nil
	}
	return s.applyDecoded(seq, data, nil)
}

// ApplyIfNext applies message seq only if it is the next one (applied+1): the writer of
// a message applies it from memory when its publish is acknowledged, and leaves it to
// the consumer otherwise. entries, if not nil, are data already decoded (by
// DecodeEnvelope). applied reports whether it did.
func (s *Store) ApplyIfNext(seq uint64, data []byte, entries []Entry) (verdicts []error, applied bool, err error) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if seq != s.applied.Load()+1 {
		return nil, false, nil
	}
	verdicts, err = s.applyDecoded(seq, data, entries)
	return verdicts, err == nil, err
}

// applyDecoded applies the message's entries (decoded from data when nil) as one batch.
// A message that does not decode is recorded as rejected at its sequence; one of a
// newer format, or a failure of this node's storage, stops the applier (an error).
func (s *Store) applyDecoded(seq uint64, data []byte, entries []Entry) ([]error, error) {
	if entries == nil {
		var err error
		var m Message
		if m, err = s.reader.decode(seq, data); err != nil {
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) || s.hooks.StopOnUndecodable {
				return nil, err
			}
			return []error{}, s.reject(corrupt)
		}
		entries = m.Entries
	}
	indexed := false
	for i := range entries {
		indexed = indexed || entries[i].Kind == KindRetire
	}
	tx := newApplyBatch(s, seq, indexed)
	defer tx.close()
	verdicts := make([]error, len(entries))
	for i := range entries {
		verdicts[i] = tx.judge(i, &entries[i])
		if errors.Is(verdicts[i], ErrStorage) || errors.Is(verdicts[i], ErrNewerFormat) {
			s.dropCache() // it may hold this batch's changes
			return nil, fmt.Errorf("checkpoint: apply sequence %d, entry %d: %w", seq, i, verdicts[i])
		}
	}
	if err := tx.commit(); err != nil {
		return nil, err
	}
	s.applied.Store(seq)
	s.term.Store(tx.term)
	if tx.clusterVersion > 0 {
		s.clusterVersion.Store(int64(tx.clusterVersion))
	}
	return verdicts, nil
}

// reject records a message that does not decode as rejected at its sequence, and
// moves the applied sequence past it.
func (s *Store) reject(c *CorruptError) error {
	b := s.db.NewBatch()
	defer b.Close()
	raw, err := json.Marshal(RejectedMessage{Seq: c.Seq, Detail: c.Detail})
	if err != nil {
		return fmt.Errorf("checkpoint: encode rejection: %w", err)
	}
	_ = b.Set(keyRejected(c.Seq), raw, nil)
	_ = b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, c.Seq), nil)
	_ = b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, c.Seq), nil) // nothing to index: still current
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("checkpoint: record the rejection of sequence %d: %w: %w", c.Seq, ErrStorage, err)
	}
	s.applied.Store(c.Seq)
	s.counters.LogRejected.Add(1)
	return nil
}

// RejectedMessages are the log messages that could not be decoded, oldest first.
func (s *Store) RejectedMessages() ([]RejectedMessage, error) {
	return scanJSON[RejectedMessage](s.db, prefixRejected)
}

// runCacheSize bounds the decoded runs the applier keeps; decoding a run's JSON on
// every message was most of the cost of applying one.
const runCacheSize = 4096

func (s *Store) dropCache() { clear(s.runs) }

// trimCache evicts runs not touched recently once the cache is over its size. Which
// runs stay cached changes only speed, never an outcome.
func (s *Store) trimCache() {
	if len(s.runs) <= runCacheSize {
		return
	}
	for id, c := range s.runs {
		if c.touched+runCacheSize/2 < s.applied.Load()+1 || c.run.Status.Terminal() {
			delete(s.runs, id)
		}
	}
	if len(s.runs) > runCacheSize {
		s.dropCache()
	}
}

func (s *Store) getJSON(key []byte, v any) (bool, error) {
	return getJSON(s.db, key, v)
}

// failReadOf, set at link time (-ldflags "-X .../checkpoint.failReadOf=r/victim") and
// empty in every other build, makes every read of that one key fail as a disk read
// would: the real-process test that a storage failure during apply stops the applier
// (clustertest TestStorageFailureStopsTheNode). A package variable because a process's
// hooks cannot be set from another process.
var failReadOf string

func getJSON(r pebble.Reader, key []byte, v any) (bool, error) {
	if failReadOf != "" && string(key) == failReadOf {
		return false, fmt.Errorf("checkpoint: read %q: %w: an injected read failure (failReadOf)", key, ErrStorage)
	}
	raw, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checkpoint: read %q: %w: %w", key, ErrStorage, err)
	}
	defer closer.Close()
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("checkpoint: decode %q: %w: %w (the state is corrupt; move it aside and let flowd replay the log)", key, ErrStorage, err)
	}
	return true, nil
}

// scan calls fn for every key with the prefix, in key order, until fn returns false.
func scan(r pebble.Reader, prefix, from []byte, fn func(k, v []byte) (bool, error)) error {
	lower := prefix
	if from != nil {
		lower = from
	}
	opts := &pebble.IterOptions{LowerBound: lower}
	if len(prefix) > 0 {
		opts.UpperBound = prefixEnd(prefix)
	}
	it, err := r.NewIter(opts)
	if err != nil {
		return fmt.Errorf("checkpoint: scan %q: %w: %w", prefix, ErrStorage, err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return fmt.Errorf("checkpoint: scan %q: %w: %w", prefix, ErrStorage, err)
		}
		more, err := fn(it.Key(), v)
		if err != nil {
			it.Close()
			return err
		}
		if !more {
			break
		}
	}
	if err := it.Error(); err != nil {
		it.Close()
		return fmt.Errorf("checkpoint: scan %q: %w: %w", prefix, ErrStorage, err)
	}
	return it.Close()
}

func scanJSON[T any](r pebble.Reader, prefix []byte) ([]T, error) {
	var out []T
	err := scan(r, prefix, nil, func(k, v []byte) (bool, error) {
		var x T
		if err := json.Unmarshal(v, &x); err != nil {
			return false, fmt.Errorf("checkpoint: decode %q: %w", k, err)
		}
		out = append(out, x)
		return true, nil
	})
	return out, err
}

// Dump writes every key and value in key order, one per line. Two stores that applied
// the same log prefix dump identical bytes.
func (s *Store) Dump(w io.Writer) error {
	return scan(s.db, nil, nil, func(k, v []byte) (bool, error) {
		_, err := fmt.Fprintf(w, "%q = %q\n", k, v)
		return err == nil, err
	})
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}

// ScheduleChanged returns a channel closed the next time a message that adds a workflow
// version or records a cron tick is applied: what the cron planner reads. (It used to
// wake on every applied message and rescan every workflow version each time.)
func (s *Store) ScheduleChanged() <-chan struct{} {
	s.schedMu.Lock()
	defer s.schedMu.Unlock()
	if s.sched == nil {
		s.sched = make(chan struct{})
	}
	return s.sched
}

func (s *Store) scheduleChanged() {
	s.schedMu.Lock()
	defer s.schedMu.Unlock()
	if s.sched != nil {
		close(s.sched)
		s.sched = nil
	}
}
