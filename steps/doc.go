// Package steps defines what a step is ([Step]), the registry of step kinds that an
// embedding program extends with its own Go steps ([Registry]), and the built-in kinds:
// exec, http, sleep and noop.
//
// A step gets its rendered `with`, the run's ID and epoch, and an idempotency key that
// is the same for every epoch of the same (run, step, item), so that downstream
// systems can fence on the epoch and deduplicate on the key. It returns a JSON output
// or an error; errors are retryable unless wrapped with [Permanent].
package steps
