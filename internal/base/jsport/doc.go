// Package jsport is flow's one home for JetStream: it implements package port's
// interfaces (the buckets, the task queue, the log stream, the snapshots' object store,
// the dead-letter publisher) on nats.go's jetstream client, and holds every stream's and
// bucket's configuration, their creation (which never updates an existing stream), the
// checks that find one sealed or reconfigured, and the repair an admin runs.
// It links no server code: internal/base/natsnode starts the embedded server.
//
// Nothing else of flow calls JetStream for the shell's work: epoch, logstream, the task
// queue, the leader and the workers take ports, which the simulation
// (engine/internal/sim) implements too; port/porttest states, against both, what they
// may assume (docs/testing.md).
package jsport
