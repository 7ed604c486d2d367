// Package testhooks is the one value through which tests reach into a node: switches
// that turn a guard off (the negative controls of docs/testing.md), faults to inject,
// and signals to wait on (as River's TestSignals). It is internal: no program outside
// this module can turn a guard off, and flowd never does. The zero value, and a nil
// *Hooks wherever a package takes one, is production: every guard on, nothing injected.
package testhooks

import "sync/atomic"

// Hooks are one node's test switches. Packages read the fields of the parts they own:
// checkpoint the store guards, epoch the lease guards, logstream the log's, engine the
// rest. The plain bool fields are set before the part starts; the atomic ones may be
// flipped while it runs.
type Hooks struct {
	// Guards of the state machine (checkpoint), tagged so that tests can find them all.
	NoEpochCheck      bool `guard:"store"` // accept commits whatever their epoch
	NoCheckpointCheck bool `guard:"store"` // accept a commit of a (step, item) that already has one
	NoTermCheck       bool `guard:"store"` // accept scheduler entries of any term
	NoStartCheck      bool `guard:"store"` // accept a step start of a step that is already checkpointed
	NoClaimOnceCheck  bool `guard:"store"` // accept a claim of an epoch that was claimed before (and given up)
	TermFromAnyEntry  bool `guard:"store"` // raise the applied term from any entry with a term, accepted or not (a leader spinning on a term it never won)
	StopOnUndecodable bool `guard:"store"` // an undecodable message stops the applier (an error) instead of being recorded as rejected
	NoSignalDedup     bool `guard:"store"` // a signal whose id was applied before is applied again
	NoConsumeOnce     bool `guard:"store"` // a commit may consume a signal another step consumed
	NoEarlySignals    bool `guard:"store"` // a signal reaches only a run parked on it; one sent earlier is dropped (not kept for the wait)
	NoCancelCascade   bool `guard:"store"` // a cancelled run's children go on
	NoDeadlineCheck   bool `guard:"store"` // a deadline miss is recorded on a run that succeeded before its deadline
	NoChildEpochCheck bool `guard:"store"` // a child's submit is accepted whatever epoch of its parent wrote it
	NoChildLoopCheck  bool `guard:"store"` // a run may start a child of a workflow one of its ancestors runs
	NoTreeLimit       bool `guard:"store"` // a child's submit is accepted however large its run's tree
	NoInputsByExclude bool `guard:"store"` // not_the_starter counts whoever changed the run's inputs (retry --input)
	NoDecisionCheck   bool `guard:"store"` // a decision that cannot count (a repeat, an excluded person's, after the step ended) is recorded as if it could
	NoInboxBytes      bool `guard:"store"` // a signal is kept whatever the bytes the run's inbox holds
	NoParkCheck       bool `guard:"store"` // a wake ends the run's current park whatever park (and step) it names
	NoHandlerOnce     bool `guard:"store"` // a handler run starts on every accepted entry that leaves its run failed, not only on the one that failed it
	NoStepDrain       bool `guard:"store"` // a step's slot given back by someone other than its owner (a cancel, a retry) is free at once, whatever its owner's lease

	// Guards of a run lease (epoch). Both together are the seeds' scenario C: a worker
	// without its heartbeat, which never renews and never notices it lost its lease.
	NoRenew      bool // the holder never renews (its lease lapses after the TTL)
	NoKillSwitch bool // the holder never notices its trust window has passed

	// The log (logstream).
	PassQueue  bool        // an inline write may go out ahead of queued ones (TestWritersKeepTheirOrder's control)
	NoLogCheck bool        // the applier does not check the log's identity and continuity (a recreated stream, a purge past the applied sequence)
	Deaf       atomic.Bool // the current consumer hears nothing until the supervisor replaces it
	FailApply  atomic.Bool // the applier stops on the next message it consumes, as on a storage failure
	HoldApply  atomic.Bool // the applier applies nothing while set; cleared, it consumes again from its applied sequence (a node lagging behind the log)

	// The engine.
	ForceDegraded         atomic.Bool  // this node's leases count as degraded
	IgnoreDegraded        atomic.Bool  // the degraded guard is off (its control)
	FastPathGivenIDs      atomic.Bool  // submit and assign in one message for given run IDs too (unsafe)
	NoOwnRuns             atomic.Bool  // the leader never assigns a run to itself
	LostClaims            atomic.Int32 // this many claim writes are not made and fail as of unknown outcome
	QueueAheadN           atomic.Int32 // overrides how many runs may wait assigned for a worker
	NoAdmission           atomic.Bool  // the admission guard is off (its control)
	AdmitPastWaiting      atomic.Bool  // the short path may pass runs waiting for room (its control)
	KeepEndedRunning      atomic.Bool  // a cancelled run's epoch keeps running (TestCancelStopsTheStepProcess's control)
	NoTermRaise           atomic.Bool  // a leader whose term is below the applied one does not raise the bucket's terms
	NoSitOut              atomic.Bool  // a node whose applier stopped goes on leading and campaigning (TestStoppedApplierLeavesTheElection's control)
	IgnorePause           atomic.Bool  // the leader's cron fires a paused schedule's ticks (TestPausedScheduleFiresNothing's control)
	BackfillRandomIDs     atomic.Bool  // a backfill's runs get new IDs, not their ticks' (TestBackfillRunsEachTickOnce's control)
	RetryResetsAll        atomic.Bool  // a retry from a step resets every step, not only it and its dependents (TestRetryFromAStepRunsItAndItsDependentsOnce's control)
	RandomChildIDs        atomic.Bool  // a workflow step's child gets a new ID at each start (TestChildStartedOnceAcrossAnOwnerKill's control)
	NoChildBinding        atomic.Bool  // people may start runs under children's IDs and a parent adopts whatever runs under its child's ID (TestSquattedChildIsRefused's control)
	CompactPastLive       atomic.Bool  // compaction ignores the other live nodes' reports: it purges up to the newest snapshot (TestCompactionKeepsWhatALaggingNodeNeeds's control)
	TakeTwice             atomic.Bool  // a node may take and run one epoch twice at once (the simulation's take-once control; seed 932)
	NoLeaseRead           atomic.Bool  // a reclaim does not read the run's lease from the server first (the simulation's lease-read control)
	LapseIgnoresOwner     atomic.Bool  // a lapsed lease's reclaim takes the epoch from whoever owns it now, not only from the lease's holder
	ReconcileOnStaleWatch atomic.Bool  // the reconcile reclaims on a lease watch that lags behind
	NoReconcile           atomic.Bool  // the leader never reconciles: a lost task or a dead owner's run is never found (the simulation's reconcile control)
	RandomTickHandlerIDs  atomic.Bool  // the on_deadline handler run of a tick that never ran gets a new ID at each write, not the tick's (TestTickNeverRanStartsItsHandlerOnce's control)
	NoMasking             atomic.Bool  // a run's secret inputs are not masked in its steps' logs and outputs (the masking's control)
	GateIgnoresRoster     atomic.Bool  // the leader raises the cluster version to the newest format whatever its members read (the simulation's gate control)
	NoSlotDrain           atomic.Bool  // a concurrency key's slot is free once the state stops counting its run, whatever its lease (TestKeyHoldsOneRunAtATime's control)
	NoTermTail            atomic.Bool  // a new leader counts concurrency keys' slots without first applying what the last leader wrote (TestKeySlotsControls' "term tail off")
	SignalStartApart      atomic.Bool  // signal-with-start writes the submit and the signal as two log messages (the simulation's "sws" control)
	LabelsOff             atomic.Bool  // workers take every task, whatever runs_on its run needs (the worker labels' control)
	NoStepSlots           atomic.Bool  // a worker runs a step with concurrency keys without holding their slots (the step slots' control)
	RatesLocal            atomic.Bool  // each node paces rate_limit keys alone, in its memory (the shared bucket's control)
	KeySchemeOff          atomic.Bool  // every run's http keys are run, step and item only, whatever its key scheme (TestRetryWithAnotherDatePaysItOnce's control)
	TriggerIDPerDelivery  atomic.Bool  // a trigger's run ID also names the message's stream sequence, so it de-duplicates nothing (TestTriggers' control)

	// Signals.
	ScheduledUpTo atomic.Uint64 // the applied sequence the scheduler's last finished pass had seen
}

// OrProduction returns h, or the production value when h is nil, so that callers
// read fields without nil checks.
func OrProduction(h *Hooks) *Hooks {
	if h == nil {
		return new(Hooks)
	}
	return h
}
