package steplog

import (
	"context"
	"encoding/json"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/port"
)

// Filter narrows what Read returns; its zero value is everything.
type Filter struct {
	Step    string // "": every step
	Item    *int   // nil: every item and the whole step
	Attempt int    // 0: every attempt
}

func (f Filter) keeps(l client.LogLine) bool {
	switch {
	case f.Step != "" && l.Step != f.Step:
		return false
	case f.Item != nil && (l.Item == nil || *l.Item != *f.Item):
		return false
	case f.Attempt > 0 && l.Attempt != f.Attempt:
		return false
	}
	return true
}

// Read reads run's lines after the message at sequence after (0: from the first), up to
// about max lines (whole messages), and returns them with the sequence to read after
// next (after itself when there was nothing more).
func Read(ctx context.Context, logs port.StepLogs, run string, after uint64, f Filter, max int) ([]client.LogLine, uint64, error) {
	var out []client.LogLine
	for len(out) < max {
		m, ok, err := logs.Next(ctx, run, after)
		if err != nil {
			return out, after, err
		}
		if !ok {
			break
		}
		after = m.Seq
		var msg message
		if json.Unmarshal(m.Data, &msg) != nil {
			continue // not a step log message: nothing of it is shown
		}
		for _, l := range msg.Lines {
			if f.keeps(l) {
				out = append(out, l)
			}
		}
	}
	return out, after, nil
}
