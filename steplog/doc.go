// Package steplog keeps what steps print: a Writer per step attempt splits what the
// step writes into lines, masks the run's secrets in them, bounds their bytes (a marker
// says where it stopped keeping them) and appends them in batches to the run's part of
// the step logs' stream (port.StepLogs), each line marked with the step, item, attempt
// and epoch that printed it; Read reads them back, narrowed.
//
// Step logs are not the checkpoint log: they decide nothing, are not fenced and are not
// in the state. A step killed when its epoch ended keeps what it printed, marked with
// that epoch, which is how a reader tells a zombie's lines from its successor's.
package steplog
