package webui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/internal/base/ident"
)

// The steps' logs on the run page (docs/ui.md, "Step logs"). The page is rendered with
// one run.logs page of the whole run (run.logs's bound: about 2,000 lines), grouped by
// step, and carries the cursor after them; its script then follows the run's log from
// that cursor through runLogs below (one request a second while the run goes on) and
// puts each line in its step's view. One read of the whole run, not one per step:
// run.logs reads the run's messages in order whatever the step asked, so a page of S
// steps read step by step would read the run's log S times on every render.

// logStreams are the streams a line may come from (client.LogLine): anything else is
// shown as "other" (the class of a line is never taken from the data as it is).
var logStreams = []string{"stdout", "stderr", "log", "http", "flow"}

// stepLog is one step's log as the page first shows it.
type stepLog struct {
	Blocks []logBlock
	Lines  int
}

// logBlock is the lines of one attempt of a step (or of one of its items) in one epoch:
// a zombie's lines are kept under its own epoch, so they stay apart from those of the
// attempt that replaced it, under a header that says which they are.
type logBlock struct {
	Epoch   int64
	Item    int // -1: the whole step
	Attempt int
	Lines   []logLine
}

// Key names the block in the page (data-key), as ui.js names the blocks it adds.
func (b logBlock) Key() string { return fmt.Sprintf("%d/%d/%d", b.Epoch, b.Item, b.Attempt) }

// Head is the block's header, as ui.js writes it for the blocks it adds.
func (b logBlock) Head() string {
	h := fmt.Sprintf("epoch %d", b.Epoch)
	if b.Item >= 0 {
		h += fmt.Sprintf(" · item %d", b.Item)
	}
	return h + fmt.Sprintf(" · attempt %d", b.Attempt)
}

// less orders blocks by epoch, then item, then attempt (ui.js inserts in this order).
func (b logBlock) less(o logBlock) bool {
	if b.Epoch != o.Epoch {
		return b.Epoch < o.Epoch
	}
	if b.Item != o.Item {
		return b.Item < o.Item
	}
	return b.Attempt < o.Attempt
}

// logLine is a line as the page shows it.
type logLine struct {
	Stream string // one of logStreams, or "other"
	Tag    string // the stream's word beside the line ("" for stdout, the usual one)
	Text   string
	At     clockTime
}

// clockTime is a line's time: the time of day in UTC to the second in the page (the
// script shows it in the viewer's zone), the whole UTC time to the millisecond on hover,
// and to the millisecond in datetime (more digits than a browser's Date reads).
type clockTime struct {
	Attr, Text, Title string
}

func lineTime(s string) clockTime {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return clockTime{Text: "--:--:--"}
	}
	t = t.UTC()
	return clockTime{Attr: t.Format("2006-01-02T15:04:05.000Z07:00"), Text: t.Format("15:04:05"), Title: t.Format("2006-01-02 15:04:05.000") + " UTC"}
}

func viewLine(l client.LogLine) logLine {
	stream := "other"
	if slices.Contains(logStreams, l.Stream) {
		stream = l.Stream
	}
	tag := stream
	if stream == "stdout" {
		tag = ""
	}
	return logLine{Stream: stream, Tag: tag, Text: l.Line, At: lineTime(l.At)}
}

// stepLogs groups a page of the run's lines by step, each step's by block in block order.
func stepLogs(lines []client.LogLine) map[string]*stepLog {
	out := map[string]*stepLog{}
	for _, l := range lines {
		sl := out[l.Step]
		if sl == nil {
			sl = &stepLog{}
			out[l.Step] = sl
		}
		b := logBlock{Epoch: l.Epoch, Item: -1, Attempt: l.Attempt}
		if l.Item != nil {
			b.Item = *l.Item
		}
		i := slices.IndexFunc(sl.Blocks, func(o logBlock) bool { return o.Epoch == b.Epoch && o.Item == b.Item && o.Attempt == b.Attempt })
		if i < 0 { // a new block, before the first that comes after it
			if i = slices.IndexFunc(sl.Blocks, b.less); i < 0 {
				i = len(sl.Blocks)
			}
			sl.Blocks = slices.Insert(sl.Blocks, i, b)
		}
		sl.Blocks[i].Lines = append(sl.Blocks[i].Lines, viewLine(l))
		sl.Lines++
	}
	return out
}

// logsView is what the run page carries for its script: where to follow the steps'
// logs from, and how many lines it shows (the script keeps the lines it followed past
// them when the page's main part is swapped for a new one that shows fewer).
type logsView struct {
	URL   string
	After string
	Lines int
	Error string // the logs could not be read for the page (the script tries from the start)
}

// runLogs is GET /ui/runs/{id}/logs?after=CURSOR[&step=S]: a page of what the run's
// steps printed after the cursor (run.logs's client.StepLogPage as JSON), for the run
// page's script, which follows the run's log with it while the run goes on. It needs
// the run page's sign-in; without a session it answers 401 rather than a redirect to
// the sign-in page, which a script reading JSON could not follow. The lines are data:
// JSON escapes <, > and & in them, and the script shows them as text.
func (s *Server) runLogs(w http.ResponseWriter, r *http.Request) {
	se := s.sessionOf(w, r)
	if se == nil {
		http.Error(w, "sign in first: /ui/login", http.StatusUnauthorized)
		return
	}
	if !client.RoleAllows(se.role, "run.logs") {
		http.Error(w, fmt.Sprintf("not authorized: run.logs needs the %s role", client.RoleFor("run.logs")), http.StatusForbidden)
		return
	}
	id, q := r.PathValue("id"), r.URL.Query()
	step, after := q.Get("step"), q.Get("after")
	// The cursor is run.logs's (a sequence number): one that is not is refused here with
	// a clear 400, where the node would answer it as its own failure.
	if after != "" {
		if _, err := strconv.ParseUint(after, 10, 64); err != nil {
			http.Error(w, fmt.Sprintf("cursor %q is not one this page was given: pass the last answer's next unchanged, or none for the first line", truncate(after, 64)), http.StatusBadRequest)
			return
		}
	}
	ctx := r.Context()
	if step != "" {
		if !ident.ValidName(step) {
			http.Error(w, fmt.Sprintf("step %q is not a step name: use a-z, 0-9, '-' and '_'", truncate(step, 64)), http.StatusBadRequest)
			return
		}
		run, err := do[client.Run](ctx, s.cfg.Backend, "run.get", client.Request{ID: id})
		if err != nil {
			s.dataError(w, r, err)
			return
		}
		if !slices.ContainsFunc(run.Steps, func(st client.Step) bool { return st.Name == step }) {
			http.Error(w, fmt.Sprintf("run %s has no step %q", id, step), http.StatusBadRequest)
			return
		}
	}
	page, err := do[client.StepLogPage](ctx, s.cfg.Backend, "run.logs", client.Request{ID: id, Step: step, After: after})
	if err != nil {
		// run.logs does not say that a run is unknown in so many words; run.get does.
		if _, gerr := do[client.Run](ctx, s.cfg.Backend, "run.get", client.Request{ID: id}); gerr != nil {
			err = gerr
		}
		s.dataError(w, r, err)
		return
	}
	if page.Lines == nil {
		page.Lines = []client.LogLine{} // [] for the script, never null
	}
	b, err := json.Marshal(page) // escapes <, > and &: nothing in it reads as markup, whatever reads it
	if err != nil {
		s.dataError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// dataError answers a failed read of runLogs with the status it deserves and its
// message as text (the page's script shows it).
func (s *Server) dataError(w http.ResponseWriter, r *http.Request, err error) {
	http.Error(w, err.Error(), s.statusOf(r, err))
}

// truncate shortens what a request sent before it is quoted back in an error.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
