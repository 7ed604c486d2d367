// Package engine wires flow together: NATS (embedded or external), the checkpoint log
// and its applier, the elector and the leader-only scheduler services, the workers that
// run steps under run leases, and a small library API for embedding programs.
//
// A run's life: StartRun writes a submit entry; the leader's assigner gives it an epoch
// (an assign entry) and publishes a task (run, epoch) on the FLOW_TASKS work queue; a
// worker takes the task, acquires the run's lease for that epoch, claims the epoch in
// the log, and runs the DAG from its checkpoints, committing every step and foreach
// item through the log with the epoch. A commit refused as fenced, or a lost lease,
// stops the worker at once (lock-stolen-mid-run). When a lease lapses the leader
// reclaims the run with a new epoch and another worker resumes it.
package engine
