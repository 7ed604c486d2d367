package logstream

import "errors"

// Sentinel errors of the log's I/O. Test them with errors.Is: the errors returned carry
// context. The state machine's verdicts on an entry (fenced, stale term, ...) are
// checkpoint's sentinels.
var (
	// ErrOutputTooLarge: a step output above the configured limit (default 1 MiB), or
	// entries that together do not fit one log message.
	ErrOutputTooLarge = errors.New("logstream: output too large")
	// ErrStopped: the writer or the applier has stopped (or was stopped before Start).
	ErrStopped = errors.New("logstream: stopped")
	// ErrAppendUncertain: publishing failed and it is unknown whether the entry is in
	// the log. The writer must treat its ownership as lost.
	ErrAppendUncertain = errors.New("logstream: append outcome unknown")
	// ErrWrongLog: the log is not one this node's state can continue from (the stream
	// was deleted and created again, or purged past what this node applied, with no
	// snapshot to bridge the gap). The node refuses to serve; the error says how to
	// recover.
	ErrWrongLog = errors.New("logstream: this node's state cannot continue from the log")
	// ErrInvalidConfig: a Config the log cannot run with (Config.Validate); the error
	// names the field and the fix.
	ErrInvalidConfig = errors.New("logstream: invalid config")
)
