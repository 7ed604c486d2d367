// Package checkpoint is flow's replicated log and the Pebble state machine that applies
// it: the place where a zombie's commit fails.
//
// Every change to run state is an [Entry] appended to one JetStream stream (FLOW_LOG).
// Every node consumes the stream in order and applies each message to its own Pebble in
// one batch that also records the applied sequence ([Store.ApplyMessage]). Apply is
// deterministic: its outcome depends only on the log prefix, so every node agrees on
// which commits were accepted and which were fenced.
//
// The fencing rules live in apply.go:
//   - an assign entry's epoch is its stream sequence, so epochs only grow;
//   - a commit is accepted only if its epoch equals the run's epoch and its (step, item)
//     has no checkpoint; otherwise it is recorded as a fenced commit and the writer gets
//     an error for which errors.Is(err, ErrFenced) holds;
//   - scheduler entries carry the leader's term and are rejected once a higher term
//     has been applied.
//
// A writer appends through [Log], which packs whatever entries queued while the
// previous publish was in flight into one message (group commit: JetStream with
// SyncAlways costs one fsync per message), and [Ticket.Await]s the outcome that its own
// node's applier computed.
package checkpoint
