// Package forge writes log entries as a writer outside the node would: a zombie whose
// epoch was taken, a node that vanished, a forger with a connection. Tests use it to
// put a node's state where only such a writer can (a run lost twice, a fenced commit)
// without reaching into the engine: it publishes on the log's subject over a NATS
// connection of its own, as anyone with the log's credentials could.
package forge
