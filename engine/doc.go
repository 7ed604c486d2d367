// Package engine is a flow node: a facade (New, Start, Stop) over the node's I/O and its
// services, with a library API for Go programs that embed it.
//
// Start opens the node's I/O (node.go: NATS embedded or joined, the log and its applier,
// the state, the leases, the task queue, the buckets) and starts the services: the
// leader's (engine/internal/leader: the election and, while leading, assignment under
// admission, reclaim and reconcile, cron, snapshots and compaction, retention), the
// workers (engine/internal/worker), and the report of the applied sequence
// (engine/internal/nodes). The services' decisions are pure functions of a read-only view
// of the state, the leases and the time, specified by transcripts; the services carry
// them out on narrow interfaces, never on the Engine.
//
// A run's life: StartRun writes a submit entry; the leader gives it an epoch (an assign
// entry) and publishes a task (run, epoch) on FLOW_TASKS; a worker takes the task,
// acquires the run's lease for that epoch, claims the epoch in the log, and runs the DAG
// from its checkpoints, committing every step and foreach item with the epoch. A commit
// refused as fenced, or a lost lease, stops the worker at once (lock-stolen-mid-run).
// When a lease lapses the leader reclaims the run with a new epoch and another worker
// resumes it.
//
// What a program around the engine may know of its insides is Health and Metrics
// (flowd's /readyz and /metrics); API is the library API in client's wire types (the API
// service); Store, Log and JetStream are for tests and tools.
package engine
