package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// keyLogIdentity holds the identity of the log this state was built from.
var keyLogIdentity = []byte("m/log")

// LogIdentity is the identity of the log this state was built from (the stream's name
// and creation time, as package logstream writes it), or "" before any was recorded.
func (s *Store) LogIdentity() (string, error) {
	v, closer, err := s.db.Get(keyLogIdentity)
	if errors.Is(err, pebble.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("checkpoint: read the log identity: %w: %w", ErrStorage, err)
	}
	defer closer.Close()
	return string(v), nil
}

// SetLogIdentity records the identity of the log this state is built from. The caller
// checks it against the log at every start: a state applied from one log must never be
// continued from another (a stream deleted and created again restarts its sequences).
func (s *Store) SetLogIdentity(id string) error {
	if id == "" {
		return fmt.Errorf("%w: an empty log identity", ErrInvalidEntry)
	}
	if err := s.db.Set(keyLogIdentity, []byte(id), pebble.Sync); err != nil {
		return fmt.Errorf("checkpoint: record the log identity: %w: %w", ErrStorage, err)
	}
	return nil
}

// Skip moves the applied sequence to seq when the log holds no message after the
// applied one up to seq: they were deleted from the stream, and deleted sequences count
// as seen. It must not be called for sequences that hold messages. A seq at or below
// the applied one changes nothing.
func (s *Store) Skip(seq uint64) error {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	if seq <= s.applied.Load() {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, seq), nil)
	_ = b.Set(keyNewestAt, binary.BigEndian.AppendUint64(nil, seq), nil) // no run changed: still current
	if err := b.Commit(pebble.NoSync); err != nil {
		return fmt.Errorf("checkpoint: skip to sequence %d: %w: %w", seq, ErrStorage, err)
	}
	s.applied.Store(seq)
	return nil
}
