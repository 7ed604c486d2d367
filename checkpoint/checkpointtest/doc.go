// Package checkpointtest makes logs for tests of the checkpoint state machine and of the
// I/O around it: deterministic, varied, with zombies' stale writes mixed in.
package checkpointtest
