// Package sim is a deterministic simulation of a flow cluster (issue 30), in the manner
// of etcd raft's rafttest and FoundationDB's simulator: three flowd nodes and a NATS
// server over a simulated network and clock, driven by a seed, with the invariants of
// DESIGN.md checked after every event that can move them. A failing seed is printed and
// replayed exactly (go test ./engine/internal/sim -run 'TestSimulation$' -sim.seed=S -v
// prints its trace, one line per event).
//
// # What runs for real, and what is modelled
//
// The decisions are the real ones: every node applies the log with its own
// checkpoint.Store (real Pebble on vfs.NewMem, with the store's guards); the leader
// decides with engine/internal/leader (PlanAssign under Admission, Reconciler.Pass,
// LockDelay.Due, Reclaimable, CronDue and PlanTicks); the workers with
// engine/internal/worker (JudgeTask, ReadySteps, DecideAttempt, DecideEnd, IsVerdict); every holder of
// a term or a lease takes its timing from epoch.Trust (Begin, RenewAt, AttemptDeadline,
// RetryAt, Renewed, Unanswered, Ended, Deadline, LapseAfter). Only the I/O shell around
// them is written again here, deterministically:
//
//   - server.go, NATS JetStream: the log (a publish gets the next sequence, is deduplicated
//     by its message ID, and with DupP lands a second time later, as when JetStream's
//     dedup state is lost); the KV buckets of the term and the leases (one revision
//     counter per bucket, a TTL per key on the server's clock, lapse markers that take a
//     revision; Create, Update at a revision, a conditional Delete, the latest value, a
//     watch); the task queue (a work queue: fetch, ack, nak with a delay, redelivery after
//     the ack wait, a one-minute duplicate window).
//   - node.go, a flowd: its store (a kill keeps it), its applier (a consumer that asks
//     for the messages after its applied one and applies them in order), its log writer
//     (logstream.Writer: one publish in flight carrying everything queued, retried with
//     the same message ID for logstream.DefaultPublishTimeout, the writer's own message
//     applied from memory when it is the next one, a write's outcome its entries'
//     verdicts on its own node).
//   - holder.go, epoch's keeper: renewals, the kill switch, a lease's degraded state.
//   - leader.go, the election and the term's services (the assigner's loop, the lease
//     watcher with its sweep, cron).
//   - worker.go, the pool: fetch, judge, acquire, claim, drain; run.go, one epoch of a
//     run on a node: the DAG, commits, foreach items, waits; each step attempt is a
//     process that takes a random time and does a side effect at a random moment of
//     it; it is killed with its epoch, with its node, and by its containment watchdog at
//     its lease's trust deadline even while its node is paused (issue 24's watchdog; the
//     deadline is the one its node last moved).
//   - world.go: the network, the faults, the client and the end-of-run checks.
//
// # Determinism
//
// One goroutine runs one event at a time from a priority queue ordered by (simulated
// time, insertion sequence); every random choice comes from one math/rand/v2 PCG seeded
// by the seed; decisions never range over a map without sorting its keys; nothing reads
// the wall clock (entries carry the simulated time as their At). Pebble's own goroutines
// change no outcome. A node's events carry its incarnation (a kill drops them) and are
// held while it is paused (on resume they run late, in order, as a stopped process's
// timers do); a step process's events are not held by a pause, since the process is not
// paused. TestSimulationIsDeterministic runs seeds twice and compares the traces.
//
// # Faults
//
// Drawn by the seed, until FaultsFor: messages on a node's link lost (both ways) or on a
// slow path of up to a TTL; a node partitioned (its requests time out; a message in
// flight is lost); a node paused (SIGSTOP); killed and restarted (its memory lost, its
// store kept: it catches up from the log); drained (its runs handed back) and restarted;
// the leader key lapsing (failover follows from all of these); log messages appended
// twice. Then every fault heals, and every run must end within Settle (liveness).
//
// # Invariants, and where they are checked
//
// A reference store applies every message as it is appended (the state of the whole
// log); the shared checker of package checkpoint/invariants (the property test's) checks
// each message on it: invariants 1, 2, 3, 4 and 5, one owner per epoch, no stale term
// accepted, nothing running without an owner. Each side effect is checked when it happens
// (invariant 8: its epoch is the run's current one in the reference; invariant 3: no
// epoch owned after a step's checkpoint runs the step). Each node's verdicts for each
// sequence are compared with the reference's when it applies it, and at the end every
// node's Store.Dump with the reference's (invariant 9). Once the faults stop, every run
// must end within Settle ("liveness", invariant 6's purpose).
//
// # What it does not model
//
// A NATS server's own crash, its replicas (R3) and stale reads from them; clock drift
// between machines (every clock is the simulated one; the trust window's margin against
// drift is not exercised); a node's Pebble losing unsynced writes (checkpoint's crash
// tests do that); snapshots, log compaction and retention; cancels, retries and purges
// by operators; the API's short path (an assign naming the leader's own worker);
// concurrency limits; the degraded guard's timing beyond "no new task"; exec steps' real
// processes. The real-process tests (clustertest, engine, epoch) stay: they check what
// this simulation assumes of NATS, Pebble and the kernel.
package sim
