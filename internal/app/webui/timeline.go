package webui

import (
	"fmt"
	"time"

	"github.com/flowrun/flow/client"
)

// The run page's timeline: a Gantt of the run's steps (each from its first start to its
// checkpoint or final failure, or to now while it runs or waits), the epochs as lines at
// the moments they began (with their reason), and the fenced commits as marks on their
// step's row at the moment the log refused them. An SVG drawn on the server, like the
// step graph: no script, no inline style.

type timeline struct {
	Width, Height int
	Rows          []timelineRow
	Epochs        []timelineMark
	Fenced        []timelineMark
	Ticks         []timelineMark // the axis: a few times along it
	Span          string         // how long the timeline covers
}

type timelineRow struct {
	Name, Status string
	Y, X, W      int    // the bar (W 0: the step never started)
	Took         string // its duration (to now, if it has not ended)
	TextY        int
}

type timelineMark struct {
	X, Y  int
	Label string
	Title string
}

const (
	tlLabel  = 150 // the step names' column
	tlWidth  = 600 // the time axis
	tlRow    = 24
	tlTop    = 30 // room for the epochs' labels
	tlBottom = 24 // the axis' ticks
)

func parseTime(s *string) (time.Time, bool) {
	if s == nil || *s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	return t, err == nil
}

// buildTimeline lays the run out from its creation (or first start) to its end (or now).
// A run that never started has no timeline (nil).
func buildTimeline(run client.Run, now time.Time) *timeline {
	start, ok := parseTime(run.StartedAt)
	if !ok {
		return nil
	}
	if created, ok := parseTime(&run.CreatedAt); ok && created.Before(start) {
		start = created
	}
	end := now
	if e, ok := parseTime(run.EndedAt); ok {
		end = e
	}
	for _, st := range run.Steps {
		if e, ok := parseTime(st.EndedAt); ok && e.After(end) {
			end = e
		}
	}
	span := end.Sub(start)
	if span <= 0 {
		span = time.Millisecond
	}
	x := func(t time.Time) int {
		f := float64(t.Sub(start)) / float64(span)
		return tlLabel + int(min(max(f, 0), 1)*tlWidth)
	}
	tl := &timeline{Width: tlLabel + tlWidth + 20, Span: roundDuration(span)}
	rowOf := map[string]int{}
	for i, st := range run.Steps {
		y := tlTop + i*tlRow
		rowOf[st.Name] = y
		row := timelineRow{Name: st.Name, Status: st.Status, Y: y + 4, TextY: y + 16}
		if s, ok := parseTime(st.StartedAt); ok {
			e, ended := parseTime(st.EndedAt)
			if !ended {
				e = end
			}
			row.X, row.W = x(s), max(x(e)-x(s), 2)
			row.Took = roundDuration(e.Sub(s))
			if !ended {
				row.Took += " so far"
			}
		}
		tl.Rows = append(tl.Rows, row)
	}
	bottom := tlTop + len(run.Steps)*tlRow
	tl.Height = bottom + tlBottom
	for _, ep := range run.Epochs {
		if t, ok := parseTime(&ep.At); ok {
			tl.Epochs = append(tl.Epochs, timelineMark{X: x(t), Y: bottom, Label: fmt.Sprintf("epoch %d", ep.Epoch),
				Title: fmt.Sprintf("epoch %d: %s, %s", ep.Epoch, ep.Reason, t.UTC().Format("15:04:05.000 UTC"))})
		}
	}
	for _, f := range run.Fenced {
		t, ok := parseTime(&f.At)
		y, known := rowOf[f.Step]
		if ok && known {
			tl.Fenced = append(tl.Fenced, timelineMark{X: x(t), Y: y + 12,
				Title: fmt.Sprintf("fenced: %s item %d by %s with epoch %d (the run's was %d): %s", f.Step, f.Item, f.Owner, f.Epoch, f.CurrentEpoch, f.Reason)})
		}
	}
	for i := 0; i <= 4; i++ {
		t := start.Add(span * time.Duration(i) / 4)
		tl.Ticks = append(tl.Ticks, timelineMark{X: x(t), Y: bottom + 16, Label: "+" + roundDuration(t.Sub(start))})
	}
	return tl
}

// roundDuration is a duration as the pages show it: milliseconds under a second, tenths
// under a minute, seconds above.
func roundDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
