package sim

import "fmt"

// The workflows the client applies. Their steps are simulated processes (process.go).
var workflows = []string{
	`name: chain
max_epochs: 1
on_dead_letter: [{name: tell, uses: sim}]
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a], retry: {max_attempts: 2, initial_interval: 100ms}}
  - {name: c, uses: sim, needs: [b]}
`,
	`name: fan
max_epochs: 4
inputs:
  items: {type: list, default: [1, 2, 3, 4]}
steps:
  - {name: split, uses: sim}
  - {name: each, uses: sim, needs: [split], foreach: "{{ inputs.items }}", parallelism: 2, retry: {max_attempts: 2, initial_interval: 50ms}}
  - {name: side, uses: sim, needs: [split]}
  - {name: join, uses: sim, needs: [each, side]}
`,
	// A signal that may come before the wait, after it, twice with the same id, or never
	// (the timeout: the run goes on).
	`name: wait
max_epochs: 3
steps:
  - {name: a, uses: sim}
  - {name: w, uses: wait, needs: [a], with: {signal: go, timeout: 3s, on_timeout: continue}}
  - {name: b, uses: sim, needs: [w]}
`,
}

// The third round's features: two waits on one signal name, an approval by two people
// other than the starter, a child run, a timer (short: inline; long: parked) with a
// deadline and handlers.
var moreWorkflows = []string{
	`name: pair
max_epochs: 3
steps:
  - {name: a, uses: sim}
  - {name: w1, uses: wait, needs: [a], with: {signal: go, timeout: 3s, on_timeout: continue}}
  - {name: w2, uses: wait, needs: [a], with: {signal: go, timeout: 3s, on_timeout: continue}}
  - {name: b, uses: sim, needs: [w1, w2]}
`,
	`name: approve
max_epochs: 3
inputs:
  note: {type: string, default: first}
steps:
  - {name: a, uses: sim}
  - {name: ok, uses: approval, needs: [a], with: {approvers: {role: operator, count: 2, not_the_starter: true}, timeout: 6s}}
  - {name: b, uses: sim, needs: [ok]}
`,
	`name: parent
max_epochs: 3
steps:
  - {name: a, uses: sim}
  - {name: kid, uses: workflow, needs: [a], with: {workflow: chain}}
  - {name: b, uses: sim, needs: [kid]}
`,
	`name: nap
max_epochs: 3
deadline: 6s
inputs:
  nap: {type: string, default: 1s}
on_failure: [{name: tell, uses: sim}]
on_deadline: [{name: tell, uses: sim}]
steps:
  - {name: a, uses: sim}
  - {name: z, uses: sleep, needs: [a], with: {duration: "{{ inputs.nap }}"}}
  - {name: b, uses: sim, needs: [z]}
`,
}

// The keyed workflow holds one run per account at once (issue 39): invariant "key" is that
// no two runs of an account have a process alive at once, in the world's time, whatever
// the faults (process.go).
var keyedWorkflow = `name: keyed
max_epochs: 4
concurrency: {key: "acct-{{ inputs.acct }}", limit: 1}
inputs:
  acct: {type: string}
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a]}
`

// The slotted workflow's step b holds the run's account key (a step's concurrency):
// invariant "key" holds its process as it holds a keyed run's. Its own workflow key
// (two runs of an account at once) is kept by a run parked for b's slot and woken with
// it: the two keys must never wait for each other (invariant "liveness").
var slottedWorkflow = `name: slotted
max_epochs: 4
concurrency: {key: "slotted-{{ inputs.acct }}", limit: 2}
inputs:
  acct: {type: string}
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a], concurrency: {key: "acct-{{ inputs.acct }}", limit: 1}}
  - {name: c, uses: sim, needs: [b]}
`

// The ledger workflow is started by messages (issue 39's on:): the run ID is the
// message's ledger number, so every copy of a message names one run.
var eventWorkflow = `name: ledger
max_epochs: 3
inputs:
  day: {type: string}
on:
  - {subject: "sim.ledger.>", id: "ev-{{ msg.data.n }}", inputs: {day: "{{ msg.data.day }}"}}
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a]}
`

// The fin workflow's step b needs the worker label finance (issue 39's runs_on): its
// runs go only to the finance node, and wait while it is down (invariant "label").
var finWorkflow = `name: fin
max_epochs: 4
steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a], runs_on: [finance]}
`

// The wallet workflow's step pay is paced by the rate limit simwallet (issue 39's
// rate_limit): walletItems pays a run, three at once, walletLimit a second across the
// cluster (invariant "rate").
const (
	walletItems = 6
	walletLimit = 4
)

var walletWorkflow = fmt.Sprintf(`name: wallet
max_epochs: 6
inputs:
  items: {type: list, default: [1, 2, 3, 4, 5, 6]}
steps:
  - {name: pay, uses: sim, foreach: "{{ inputs.items }}", parallelism: 3, rate_limit: {key: simwallet, limit: %d, per: 1s}}
`, walletLimit)

// The alarm workflow sleeps until a time (its input). Its first step is long (items one
// after the other) and its max_epochs 1: a run whose owners are lost twice is
// dead-lettered, and its on_dead_letter handler runs.
var alarmWorkflow = `name: alarm
max_epochs: 1
deadline: 12s
inputs:
  at: {type: string}
  items: {type: list, default: [1, 2, 3, 4, 5, 6]}
on_failure: [{name: tell, uses: sim}]
on_dead_letter: [{name: tell, uses: sim}]
on_deadline: [{name: tell, uses: sim}]
steps:
  - {name: a, uses: sim, foreach: "{{ inputs.items }}", parallelism: 1}
  - {name: z, uses: sleep, needs: [a], with: {until: "{{ inputs.at }}"}}
  - {name: b, uses: sim, needs: [z]}
`

// cronWorkflow is the scheduled workflow, with its schedule's catch-up policy (all,
// latest, none: what a leader fires of the times it missed, which a backfill may fill
// in), or without a schedule (catchup "").
func cronWorkflow(catchup string) string {
	schedule := ""
	if catchup != "" {
		schedule = "schedule: {cron: \"@every 4s\", overlap: allow, catchup: " + catchup + "}\n"
	}
	return "name: tick\nmax_epochs: 3\n" + schedule + `steps:
  - {name: a, uses: sim}
  - {name: b, uses: sim, needs: [a]}
`
}
