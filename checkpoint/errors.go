package checkpoint

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test them with errors.Is: the errors returned carry context.
var (
	// ErrFenced: an entry carried an epoch that is not the run's current epoch, or it
	// committed a (step, item) that already has a checkpoint, or the run is not running.
	// The error is a *FencedError with both epochs.
	ErrFenced = errors.New("checkpoint: fenced")
	// ErrStaleTerm: a scheduler entry carried a term lower than the highest applied.
	ErrStaleTerm = errors.New("checkpoint: stale leader term")
	// ErrNotFound: no such run.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrRunExists: a submit named a run that already exists (a second fire of a tick).
	ErrRunExists = errors.New("checkpoint: run exists")
	// ErrTickExists: a cron tick that was already recorded.
	ErrTickExists = errors.New("checkpoint: cron tick already recorded")
	// ErrConflict: the entry is well formed but the run's state does not allow it
	// (e.g. cancelling a finished run).
	ErrConflict = errors.New("checkpoint: conflict with run state")
	// ErrInvalidEntry: the entry is malformed; it is refused before publishing, and
	// rejected (changing nothing) if another writer published it anyway.
	ErrInvalidEntry = errors.New("checkpoint: invalid entry")
	// ErrCorruptLog: a message in the log cannot be decoded. It is recorded as rejected
	// at its sequence, the same way on every node, and applying goes on
	// (docs/checkpoint.md, "Undecodable messages").
	ErrCorruptLog = errors.New("checkpoint: corrupt log message")
	// ErrNewerFormat: a message of a newer format version than this code reads. The
	// applier stops on it: skipping it would diverge from nodes that understand it.
	ErrNewerFormat = errors.New("checkpoint: log message of a newer format: upgrade flowd")
	// ErrStorage: reading or writing this node's state failed during apply. The
	// applier stops (a verdict made on a failed read would diverge from other nodes).
	ErrStorage = errors.New("checkpoint: state storage failed")
)

// NotFoundError names what was not found; errors.Is(err, ErrNotFound) holds for it. Its
// message names the thing, not the package: `run "nope" not found`.
type NotFoundError struct {
	What    string // "run", "workflow"
	Name    string
	Version int // a workflow's version, 0 for none
}

func (e *NotFoundError) Error() string {
	if e.Version > 0 {
		return fmt.Sprintf("%s %q version %d not found", e.What, e.Name, e.Version)
	}
	return fmt.Sprintf("%s %q not found", e.What, e.Name)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// FencedError describes a rejected commit (or other epoch-fenced entry).
type FencedError struct {
	Run          string
	Step         string
	Item         int
	Epoch        int64 // the epoch the writer carried
	CurrentEpoch int64 // the run's epoch when the entry was applied
	Reason       string
	Seq          uint64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("checkpoint: fenced: run %s step %q item %d: epoch %d, current %d: %s (seq %d)",
		e.Run, e.Step, e.Item, e.Epoch, e.CurrentEpoch, e.Reason, e.Seq)
}

// Is makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Is(target error) bool { return target == ErrFenced }

// StaleTermError describes a scheduler entry rejected for its term.
type StaleTermError struct {
	Kind        Kind
	Run         string
	Term        int64
	HighestTerm int64
	Seq         uint64
}

func (e *StaleTermError) Error() string {
	return fmt.Sprintf("checkpoint: stale leader term: %s for run %q carries term %d, highest applied is %d (seq %d)",
		e.Kind, e.Run, e.Term, e.HighestTerm, e.Seq)
}

// Is makes errors.Is(err, ErrStaleTerm) true.
func (e *StaleTermError) Is(target error) bool { return target == ErrStaleTerm }

// CorruptError names the log message the applier could not apply.
type CorruptError struct {
	Seq    uint64
	Detail string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint: corrupt log message at sequence %d: %s", e.Seq, e.Detail)
}

// Is makes errors.Is(err, ErrCorruptLog) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorruptLog }
