package epoch

import "errors"

// Sentinel errors; test with errors.Is.
var (
	// ErrLeaseLost: the lease or term can no longer be trusted (renewal refused, or
	// no successful renewal within the trust window). It is the cause of the holder's
	// cancelled context.
	ErrLeaseLost = errors.New("epoch: lease lost")
	// ErrNotLeader: this node does not hold the term it thought it held.
	ErrNotLeader = errors.New("epoch: not the leader")
	// ErrLeaseHeld: another owner (or another epoch) holds the run's lease.
	ErrLeaseHeld = errors.New("epoch: lease held by another owner")
	// ErrInvalidRun: the run's ID cannot be a lease key. Permanent: retrying cannot help,
	// so a task naming such a run is dropped, never redelivered in a loop.
	ErrInvalidRun = errors.New("epoch: run ID cannot be a lease key")
	// ErrInvalidConfig: a Config that cannot work.
	ErrInvalidConfig = errors.New("epoch: invalid config")
	// ErrTermOutOfReach: the log holds a term above MaxTerm, which no leader bucket
	// revision reaches (a forged entry): no leader can schedule until it is dealt with.
	ErrTermOutOfReach = errors.New("epoch: term out of reach")
)
