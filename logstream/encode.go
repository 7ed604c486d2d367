package logstream

// The writer's codec: entries validated and encoded into one message in the format the
// cluster is at, and the node's own messages decoded while their publish is in flight.

import (
	"context"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// encode validates and encodes entries into one request.
func (w *Writer) encode(entries []checkpoint.Entry) (*request, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: no entries to write", checkpoint.ErrInvalidEntry)
	}
	if len(entries) > w.maxEntries {
		return nil, fmt.Errorf("%w: %d entries for one message, at most %d", checkpoint.ErrInvalidEntry, len(entries), w.maxEntries)
	}
	r := &request{data: make([][]byte, 0, len(entries)), format: w.format(), revision: 1, note: true}
	if r.format >= checkpoint.LogFormatBinary {
		r.revision = checkpoint.MaxRevision(r.format)
	}
	for i := range entries {
		e := &entries[i]
		if checkpoint.RevisionOf(e) > checkpoint.MaxRevision(r.format) {
			return nil, fmt.Errorf("%w: %s", checkpoint.ErrInvalidEntry, checkpoint.NeedsFormat(e, r.format))
		}
		data, err := w.encodeEntry(r.format, *e)
		if err != nil {
			return nil, err
		}
		if r.size += len(data) + 1; r.size > w.maxBytes {
			return nil, fmt.Errorf("%w: %d entries of %d bytes together do not fit one log message (at most %d)", ErrOutputTooLarge, len(entries), r.size, w.maxBytes)
		}
		r.data = append(r.data, data)
		r.revision = max(r.revision, checkpoint.RevisionOf(e))
		r.note = r.note && isNote(e)
		if e.Kind == checkpoint.KindAssign {
			r.assigns = append(r.assigns, e.Run)
		}
	}
	r.future = newFuture(w.a, len(entries))
	return r, nil
}

// format is the log format new writes are encoded in: the applied cluster version's
// (checkpoint/cluster.go), or the newest with the gate off (writeNewestLinked).
func (w *Writer) format() int {
	if writeNewestLinked != "" {
		return checkpoint.NewestLogFormat
	}
	return min(w.a.store.ClusterVersion(), w.a.store.ReadFormat())
}

// writeNewestLinked, set at link time (-X
// github.com/flowrun/flow/logstream.writeNewestLinked=1), makes writers use the newest
// log format whatever the cluster version: the gate's negative control (an older node's
// applier stops at the first such message; clustertest's upgrade test).
var writeNewestLinked string

func (w *Writer) encodeEntry(format int, entry checkpoint.Entry) ([]byte, error) {
	if entry.At.IsZero() {
		entry.At = time.Now().UTC()
	}
	if err := entry.Validate(); err != nil {
		return nil, err
	}
	if len(entry.Output) > w.maxOutput {
		return nil, fmt.Errorf("%w: step %q item %d output is %d bytes, the limit is %d: write large results elsewhere and return a reference",
			ErrOutputTooLarge, entry.Step, entry.Item, len(entry.Output), w.maxOutput)
	}
	data, err := checkpoint.EncodeEntry(format, &entry)
	if err != nil {
		return nil, err
	}
	if len(data) > w.maxBytes {
		return nil, fmt.Errorf("%w: the encoded entry is %d bytes, a log message holds at most %d", ErrOutputTooLarge, len(data), w.maxBytes)
	}
	return data, nil
}

// decodeJob is a message decoded on the decoder goroutine.
type decodeJob struct {
	data    []byte
	entries []checkpoint.Entry
	err     error
	done    chan struct{}
}

func (j *decodeJob) wait() error {
	<-j.done
	return j.err
}

// predecode hands data to the decoder goroutine if it is idle, and returns the job; nil
// if it is busy (the apply then decodes). Decoding a W2 step's message took ~18 µs of
// the ~80 µs a step costs besides the fsync; overlapped with the publish's round trip,
// it is off the step's path (docs/perf.md).
func (w *Writer) predecode(data []byte) *decodeJob {
	job := &decodeJob{data: data, done: make(chan struct{})}
	select {
	case w.decodes <- job:
		return job
	default:
		return nil
	}
}

// runDecoder decodes the messages this node publishes while their publish is in flight.
func (w *Writer) runDecoder(ctx context.Context) {
	defer w.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case job := <-w.decodes:
			job.entries, job.err = checkpoint.DecodeEnvelope(0, job.data)
			close(job.done)
		}
	}
}
