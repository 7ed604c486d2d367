// Package port is what flow's shell asks of NATS, as interfaces: a KV bucket, the task
// queue, the log stream, the snapshots' object store, and the cluster's admin path.
// The clock is clockwork's.
//
// Two implementations exist, and nothing else of flow speaks to NATS:
// internal/base/jsport, on JetStream (the node flowd runs), and the simulation's server
// (engine/internal/sim), with its faults injected at these calls. The shell (epoch's
// keeper and watcher, logstream's writer and applier, the task queue, the leader's and
// the worker's services) takes these interfaces, so the simulation runs the same code
// as flowd with only the ports different (DESIGN.md, invariant 18).
//
// What each call promises is stated as tests in package port/porttest, the conformance
// suite, which both implementations run: it is what the simulation may assume of
// JetStream, and it fails when either side does something else.
//
// Errors are this package's sentinels (errors.Is), wrapped with the implementation's own
// error: ErrKeyExists, ErrWrongRevision, ErrKeyNotFound, ErrNotFound, ErrTooLarge,
// ErrClosed. Anything else (a timeout, a lost connection) is transient: the outcome of a
// write that fails that way is unknown.
package port
