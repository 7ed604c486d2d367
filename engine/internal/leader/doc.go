// Package leader is the leader's work: while this node holds the term, its services
// assign pending runs (under admission), reclaim runs whose lease lapsed, reconcile the
// state with the live leases, fire cron ticks, snapshot the state and compact the log,
// and retire runs past their retention. Every entry they write carries the term.
//
// The services only carry out decisions. Each decision is a function of a read-only
// view of the applied state (State), the live leases and the time it is given, with
// no I/O and no clock of its own, that returns what to write: PlanAssign,
// Reconciler.Pass, LockDelay.Due, PlanTicks, KeepFrom, RetireDue. The transcripts in
// testdata/*.txt are their specification (go test -run TestTranscripts; -rewrite
// regenerates, then read the diff).
package leader
