// Package sim is a deterministic simulation of a flow cluster, in the
// manner of TigerBeetle's VOPR and FoundationDB's simulator: three real flowd engines
// over a simulated NATS server, network and clocks, driven by a seed, with the
// invariants of DESIGN.md checked after every log message and side effect. A failing
// seed is printed with the command that replays it (go test ./engine/internal/sim -run
// 'TestSimulation$' -sim.seed=S -v prints its trace as it goes).
//
// # What runs for real, and what is simulated
//
// Every node is engine.NewOver: the real epoch keeper, elector and lease watcher, the
// log writer and applier, the leader's services, the worker pool with its step
// executions, checkpoint.Store on Pebble (vfs.NewMem, kept across a kill). What is
// simulated is only what the engine reaches through its ports (internal/base/port) and
// its clock:
//
//   - server.go: NATS JetStream as the ports' conformance suite (port/porttest) states
//     it, which TestServerConforms runs here and internal/base/jsport runs on a real
//     server: the log (dedup by message ID, consume from a sequence, purge), the KV
//     buckets (one revision counter per bucket, a TTL per key with lapse markers that
//     take a revision, watches), the task queue (ack, nak with a delay, redelivery
//     after the ack wait, a duplicate window), the dead-letter notices and the
//     snapshots' objects.
//   - ports.go: the node side of the ports: every call is submitted to the loop, crosses
//     the simulated network (delays, losses, partitions), is answered by the server and
//     crosses back; a call no one answers times out on the loop's clock.
//   - clock.go: each node's clockwork clock: skewed, its timers fired through the loop,
//     held while the node is paused and late while it is slow.
//   - node.go: a node's incarnations: boot (engine.NewOver and Start), kill (its calls end
//     as a closed connection, its step processes die), drain (Stop), pause and resume.
//   - process.go: the step kind "sim": a process of the world's that takes a random
//     time, does a side effect (checked) at a random moment and may fail; it dies with
//     its node, its epoch, or its containment watchdog at the lease's trust deadline.
//   - client.go: the people and programs using the cluster through engine.API: the
//     workload (chains, fan-outs, signals, approvals, children, timers, deadlines and
//     handlers, cancels, retries, cron with pauses and backfills).
//   - world.go: the faults, the end of the run, the final comparison of every node's
//     state with the reference.
//
// # Determinism
//
// The whole cluster runs in one testing/synctest bubble: time is the bubble's, and it
// moves only when every goroutine is blocked. The loop (sched.go) takes what the
// goroutines submitted only then, in the order (time, node, key), where a key names the
// call, a hash of its payload and the code path that made it; every random choice comes
// from one PCG seeded by the seed. What it cannot order is a select with two ready cases
// and goroutines woken together inside the real services: 88 of 100 seeds replay
// exactly (docs/decisions.md); a failed seed is run five more times and the harness says
// how often it failed the same way. TestSimulationIsDeterministic holds that line.
//
// # Faults
//
// Drawn by the seed, until FaultsFor: messages lost or on a slow path, partitions,
// pauses (SIGSTOP), kills and restarts, drains (SIGTERM), slow nodes (CPU starvation),
// clock skew, log messages appended twice, a node cut off from the log alone. Then
// every fault heals, and every run must end within Settle (liveness).
//
// # Invariants, and where they are checked
//
// A reference store applies every message as the server appends it; the shared checker
// of package checkpoint/invariants (the property test's) checks each message: invariants
// 1-5, one owner per epoch, no stale term accepted, the waits' rules (11), approvals
// that count, cancel cascades, deadlines. Each side effect is checked when it happens
// (invariant 8, and 3 as a side effect shows it). At the end every node's state, with
// the rest of the log applied, is the reference's byte for byte (invariant 9).
//
// # What it does not model
//
// A NATS server's own crash, its replicas (R3) and stale reads from them; a node's
// Pebble losing unsynced writes (checkpoint's crash walk does that); snapshots and
// log compaction; a node that reads only log format 1; exec steps' real processes. The
// real-process tests (clustertest, engine, epoch) stay: they run what this simulation
// assumes of NATS, Pebble and the kernel against the real things.
package sim
