// Package checkpoint is flow's state machine: the entries of the log, the rules that
// judge them, and the Pebble state they build: the place where a zombie's commit fails.
// It does no I/O but its own Pebble and links no NATS code; package logstream is the
// JetStream log around it (the writer and the consumer), as etcd's node.go is around
// raft.go.
//
// Every change to run state is an [Entry]. Every node applies the log's messages in
// order, each in one Pebble batch that also records the applied sequence
// ([Store.Apply]). Apply is deterministic: its verdicts depend only on the log prefix, so
// every node agrees on which commits were accepted and which were fenced.
//
// The fencing rules live in rules.go (apply.go decodes a message, checks the term and
// dispatches each entry to its rule):
//   - an assign entry's epoch is its stream sequence, so epochs only grow;
//   - a commit is accepted only if its epoch equals the run's epoch and its (step, item)
//     has no checkpoint; otherwise it is recorded as a fenced commit and the writer gets
//     an error for which errors.Is(err, ErrFenced) holds;
//   - scheduler entries carry the leader's term and are rejected once a higher term
//     has been applied.
//
// testdata/*.txt are transcripts of the state machine (entries in, verdicts and state
// out): read them as its specification.
package checkpoint
