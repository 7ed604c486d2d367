// Package worker is a node's workers: a Pool takes tasks while a slot is free, takes the
// run's lease for the task's epoch, claims the epoch in the log, and runs the run's DAG
// from its checkpoints, committing every step and foreach item with the epoch. A commit
// refused as fenced, or a lost lease, stops the epoch at once (lock-stolen-mid-run); a
// run ended from outside (cancelled, dead-lettered) stops its steps; a drain hands every
// run back.
//
// The decisions are pure functions (decide.go: ReadySteps, DecideEnd, JudgeTask)
// specified by the transcripts in testdata/*.txt; the pool and the run's execution
// (exec.go, step.go) carry them out on narrow interfaces of the node (State, Specs, Log,
// Leases, Tasks).
package worker
