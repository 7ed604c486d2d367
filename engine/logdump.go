package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/flowrun/flow/checkpoint"
)

// DumpedMessage is one log message as log.dump gives it: decoded whatever its format.
type DumpedMessage struct {
	Seq     uint64
	Message checkpoint.Message // Entries filtered to the run asked for
	Err     error              // why it does not decode here
}

// Log dump limits: a page holds at most this many messages, and stops early past
// dumpPageBytes of raw messages (a page is one API answer, under max_payload).
const (
	DefaultDumpLimit = 200
	MaxDumpLimit     = 1000
	dumpPageBytes    = 512 << 10
	// dumpScan bounds the messages one page reads looking for a run's entries.
	dumpScan = 20000
)

// DumpLog reads the log from sequence from (0: its first) and returns up to limit
// messages (those about run, if run is set), decoded whatever their format, and the
// sequence the next page starts at (0: the log's end was reached). It reads the log
// stream, not the state: what it shows is what every node applied or will.
func (o Ops) DumpLog(ctx context.Context, from uint64, run string, limit int) ([]DumpedMessage, uint64, uint64, error) {
	e := o.e
	if limit <= 0 {
		limit = DefaultDumpLimit
	}
	limit = min(limit, MaxDumpLimit)
	info, err := e.ports.Log.Info(ctx)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("engine: log dump: %w", err)
	}
	first, last := info.FirstSeq, info.LastSeq
	from = max(from, first, 1)
	if from > last {
		return nil, 0, first, nil
	}
	it, err := e.ports.Log.Consume(ctx, from)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("engine: log dump: %w", err)
	}
	defer it.Stop()
	var out []DumpedMessage
	bytes, scanned, next := 0, 0, from
	for next <= last && len(out) < limit && bytes < dumpPageBytes && scanned < dumpScan {
		mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		m, err := it.Next(mctx)
		cancel()
		if err != nil {
			break // the log's end as far as the server says, or it is slow: this page ends
		}
		seq := m.Seq
		if seq > last {
			break
		}
		next, scanned = seq+1, scanned+1
		d := DumpedMessage{Seq: seq}
		d.Message, d.Err = checkpoint.DecodeMessage(seq, m.Data)
		if run != "" {
			if d.Err != nil {
				continue
			}
			kept := d.Message.Entries[:0:0]
			for _, en := range d.Message.Entries {
				if en.Run == run || en.Tick != nil && en.Tick.RunID == run {
					kept = append(kept, en)
				}
			}
			if len(kept) == 0 {
				continue
			}
			d.Message.Entries = kept
		}
		bytes += len(m.Data)
		out = append(out, d)
	}
	if next > last {
		next = 0
	}
	return out, next, first, nil
}

// wireDump is a dumped message in the wire's shape: each entry as Entry's JSON.
func wireDump(d DumpedMessage) (seq uint64, format, revision int, node string, entries []json.RawMessage, errText string) {
	if d.Err != nil {
		return d.Seq, 0, 0, "", nil, d.Err.Error()
	}
	for i := range d.Message.Entries {
		raw, err := json.Marshal(&d.Message.Entries[i])
		if err != nil {
			return d.Seq, 0, 0, "", nil, err.Error()
		}
		entries = append(entries, raw)
	}
	return d.Seq, d.Message.Format, d.Message.Revision, d.Message.Node, entries, ""
}
