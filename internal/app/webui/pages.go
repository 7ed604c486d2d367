package webui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/flowrun/flow/client"
)

// view is what every page's template gets: the page's own data and who is looking.
type view struct {
	Title string
	Nav   string // the nav entry to mark as current
	User  string
	Role  string
	CSRF  string
	Auth  bool
	Page  any
}

// can says whether the viewer's role may call op (templates show only those actions).
func (v view) Can(op string) bool { return client.RoleAllows(v.Role, op) }

// page wraps a GET handler that renders a page: a fragment (only the main part, for the
// live update) when the request asks for one.
func (s *Server) page(h func(*http.Request) (string, string, any, error)) http.HandlerFunc {
	return s.authed(func(w http.ResponseWriter, r *http.Request, se *session) {
		name, title, data, err := h(r)
		if err != nil {
			s.errorPage(w, r, se, err)
			return
		}
		s.render(w, r, se, name, http.StatusOK, viewOf(se, s.authEnabled(), title, data))
	})
}

func viewOf(se *session, auth bool, title string, data any) view {
	v := view{Title: title, Page: data, Auth: auth}
	if se != nil {
		v.User, v.Role, v.CSRF = se.user, se.role, se.csrf
	}
	return v
}

// render executes a page's template into a buffer first, so that a template error is a
// clean 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, r *http.Request, se *session, name string, code int, data any) {
	t := s.pages[name]
	if t == nil {
		http.Error(w, "no page "+name, http.StatusInternalServerError)
		return
	}
	root := "layout"
	if r.Header.Get("X-Flow-Fragment") == "1" {
		root = "main"
	}
	if v, ok := data.(view); ok {
		v.Nav = name
		data = v
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, root, data); err != nil {
		s.cfg.Logger.Error("ui: render", "page", name, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}

// errorPage shows an operation's failure with the status it deserves.
func (s *Server) errorPage(w http.ResponseWriter, r *http.Request, se *session, err error) {
	code := s.statusOf(r, err)
	s.render(w, r, se, "error", code, viewOf(se, s.authEnabled(), http.StatusText(code), errorView{Code: code, Message: err.Error()}))
}

// statusOf is the HTTP status an operation's failure deserves (an internal one is
// logged).
func (s *Server) statusOf(r *http.Request, err error) int {
	code := http.StatusInternalServerError
	var ce *client.Error
	if errors.As(err, &ce) {
		switch ce.Code {
		case client.CodeNotFound:
			code = http.StatusNotFound
		case client.CodeBadRequest:
			code = http.StatusBadRequest
		case client.CodeConflict:
			code = http.StatusConflict
		case client.CodeForbidden:
			code = http.StatusForbidden
		}
	}
	if code == http.StatusInternalServerError {
		s.cfg.Logger.Error("ui", "path", r.URL.Path, "err", err)
	}
	return code
}

type errorView struct {
	Code    int
	Message string
}

// do calls an operation and decodes its answer into T.
func do[T any](ctx context.Context, b Backend, op string, req client.Request) (T, error) {
	var zero T
	out, err := b.Do(ctx, op, req)
	if err != nil {
		return zero, err
	}
	v, ok := out.(T)
	if !ok {
		return zero, fmt.Errorf("webui: %s answered %T", op, out)
	}
	return v, nil
}

// badInput is a request the UI refuses before asking anyone.
func badInput(format string, args ...any) error {
	return &client.Error{Code: client.CodeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// statuses a run can have, for the filter.
var runStatuses = []string{"pending", "running", "waiting", "succeeded", "failed", "cancelled", "dead_lettered"}

type runsView struct {
	Runs       []runRow
	Workflows  []string
	Workflow   string
	Status     string
	Statuses   []string
	Trigger    string
	Triggers   []string
	Since      string // as typed: RFC 3339, a date (midnight UTC) or a duration back (24h)
	Until      string
	Show       string // "" (top-level runs), "all", or a run's children (Parent)
	Parent     string
	Query      string
	Next       string // cursor of the next (older) page
	NextURL    string
	FirstURL   string
	SearchNote string
	Filtered   bool
}

// runRow is a run of the runs table, with its times as the table shows them.
type runRow struct {
	client.Run
	Created, Ended timeView
	Duration       string
}

// timeView is a time as the UI shows it: the UTC time to the second in the page (the
// script shows it in the viewer's zone), RFC 3339 in the datetime attribute.
type timeView struct {
	Attr, Text string
}

func uiTime(s string) timeView {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || s == "" {
		return timeView{}
	}
	return timeView{Attr: t.UTC().Format(time.RFC3339), Text: t.UTC().Format("2006-01-02 15:04:05") + " UTC"}
}

// timeTag is a time of the wire as a <time> element: UTC to the second, RFC 3339 in its
// datetime (the script shows it in the viewer's zone, the UTC on hover). A string that
// is not a time is shown as it is, escaped.
func timeTag(s string) template.HTML {
	v := uiTime(s)
	if v.Attr == "" {
		return template.HTML(template.HTMLEscapeString(s))
	}
	return template.HTML(`<time datetime="` + v.Attr + `" title="` + v.Text + `">` + v.Text + `</time>`)
}

func strOr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// duration is how long from start to end (to now for a run that has not ended), to the
// second, or "" without a start.
func duration(start, end string, now time.Time) string {
	a, err := time.Parse(time.RFC3339Nano, start)
	if err != nil || start == "" {
		return ""
	}
	b := now
	if end != "" {
		if b, err = time.Parse(time.RFC3339Nano, end); err != nil {
			return ""
		}
	}
	d := b.Sub(a)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

const pageSize = 50

// The UI's triggers filter (checkpoint.Triggers).
var runTriggers = []string{"manual", "cron", "backfill", "retry", "event", "child", "handler"}

func (s *Server) runsPage(r *http.Request) (string, string, any, error) {
	q := r.URL.Query()
	v := runsView{Workflow: q.Get("workflow"), Status: q.Get("status"), Query: strings.TrimSpace(q.Get("q")), Statuses: runStatuses,
		Trigger: q.Get("trigger"), Triggers: runTriggers, Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until")),
		Show: q.Get("show"), Parent: strings.TrimSpace(q.Get("parent"))}
	if v.Status != "" && !slices.Contains(runStatuses, v.Status) {
		return "", "", nil, badInput("status %q: use one of %s", v.Status, strings.Join(runStatuses, ", "))
	}
	if v.Trigger != "" && !slices.Contains(runTriggers, v.Trigger) {
		return "", "", nil, badInput("trigger %q: use one of %s", v.Trigger, strings.Join(runTriggers, ", "))
	}
	if v.Show != "" && v.Show != "all" {
		return "", "", nil, badInput("show %q: use all, or leave it out for the top-level runs", v.Show)
	}
	for _, f := range []string{v.Query, v.Workflow, v.Since, v.Until, v.Parent} {
		if len(f) > 256 {
			return "", "", nil, badInput("a filter of at most 256 characters is expected")
		}
	}
	if len(q.Get("before")) > 512 {
		return "", "", nil, badInput("a cursor of at most 512 characters is expected")
	}
	ctx := r.Context()
	ws, err := do[[]client.Workflow](ctx, s.cfg.Backend, "workflow.list", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	seen := map[string]bool{}
	for _, w := range ws {
		if !seen[w.Name] {
			seen[w.Name] = true
			v.Workflows = append(v.Workflows, w.Name)
		}
	}
	sort.Strings(v.Workflows)
	now := time.Now()
	rows := func(runs []client.Run) []runRow {
		out := make([]runRow, 0, len(runs))
		for _, run := range runs {
			out = append(out, runRow{Run: run, Created: uiTime(run.CreatedAt), Ended: uiTime(strOr(run.EndedAt)),
				Duration: duration(strOr(run.StartedAt), strOr(run.EndedAt), now)})
		}
		return out
	}
	if v.Query != "" {
		runs, err := s.cfg.Backend.RunsWithIDPrefix(ctx, v.Query, pageSize)
		if err != nil {
			return "", "", nil, err
		}
		v.Runs = rows(runs)
		v.SearchNote = fmt.Sprintf("runs whose ID starts with %q", v.Query)
		return "runs", "Runs", v, nil
	}
	// The list is run.list's: the UI's default is the top-level runs (no children, no
	// handler runs); times typed as dates are midnight UTC.
	opts := client.ListOptions{Workflow: v.Workflow, Trigger: v.Trigger, Parent: v.Parent, TopLevel: v.Show == "" && v.Parent == "",
		After: q.Get("before"), Limit: pageSize}
	if v.Status != "" {
		opts.Statuses = []string{v.Status}
	}
	if opts.Since, opts.Until, err = client.ParseRange(v.Since, v.Until, "since", "until", now, time.UTC); err != nil {
		return "", "", nil, badInput("%v", err)
	}
	page, err := s.cfg.Backend.RunsPage(ctx, opts)
	if err != nil {
		return "", "", nil, err
	}
	v.Runs, v.Next = rows(page.Runs), page.Next
	filter := url.Values{}
	for k, val := range map[string]string{"workflow": v.Workflow, "status": v.Status, "trigger": v.Trigger, "since": v.Since,
		"until": v.Until, "show": v.Show, "parent": v.Parent} {
		if val != "" {
			filter.Set(k, val)
			v.Filtered = v.Filtered || k != "show"
		}
	}
	if q.Get("before") != "" {
		v.FirstURL = "/ui/?" + filter.Encode()
	}
	if v.Next != "" {
		filter.Set("before", v.Next)
		v.NextURL = "/ui/?" + filter.Encode()
	}
	return "runs", "Runs", v, nil
}

// fingerprint names a state of a run: the page carries the one it shows, and its stream
// says "change" when the run's differs.
func fingerprint(run client.Run) string {
	b, _ := json.Marshal(run)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

type runView struct {
	Seen     string // fingerprint of Run
	Run      client.Run
	Graph    graph
	Steps    []stepView
	History  []client.Event
	Terminal bool
	Verify   client.Verification
	Timeline *timeline
	Pending  []client.Signal // signals in the inbox no step took yet
	// The run's times as the page shows them, and how long it took (so far).
	Created, Started, Ended, Deadline timeView
	Took                              string
	Logs                              logsView // where the script follows the steps' logs from
}

type stepView struct {
	client.Step
	Output  string // pretty JSON
	Started timeView
	Took    string
	Log     stepLog
	// LogShown: the step's log view is on the page (it has lines, or the step runs and
	// may print some; the script shows a hidden one when its first line comes).
	// LogOpen: it is open at first (the step runs, or failed: what it printed is what
	// one came for); otherwise collapsed, as outputs are.
	LogShown, LogOpen bool
}

func (s *Server) runPage(r *http.Request) (string, string, any, error) {
	id := r.PathValue("id")
	ctx := r.Context()
	run, err := do[client.Run](ctx, s.cfg.Backend, "run.get", client.Request{ID: id})
	if err != nil {
		return "", "", nil, err
	}
	hist, err := do[[]client.Event](ctx, s.cfg.Backend, "run.history", client.Request{ID: id})
	if err != nil {
		return "", "", nil, err
	}
	v := runView{Run: run, History: hist, Terminal: run.Terminal(), Seen: fingerprint(run)}
	needs, err := s.cfg.Backend.StepNeeds(run.Workflow, run.Version)
	if err != nil {
		return "", "", nil, err
	}
	shown := run.Steps
	if w := run.Waiting; w != nil {
		// The step the run waits on is drawn waiting, not pending: its state says pending
		// (it has not started its next attempt), the run says what holds it.
		shown = slices.Clone(run.Steps)
		for i := range shown {
			if shown[i].Name == w.Step && shown[i].Status == "pending" {
				shown[i].Status = "waiting"
			}
		}
	}
	v.Graph = layout(needs, shown)
	// The steps' logs: one page of the run's (bounded by run.logs), the script follows
	// from its cursor. A page whose logs cannot be read still shows the run.
	v.Logs = logsView{URL: "/ui/runs/" + url.PathEscape(id) + "/logs"}
	logs := map[string]*stepLog{}
	if page, err := do[client.StepLogPage](ctx, s.cfg.Backend, "run.logs", client.Request{ID: id}); err != nil {
		v.Logs.Error = err.Error()
	} else {
		v.Logs.After, v.Logs.Lines, logs = page.Next, len(page.Lines), stepLogs(page.Lines)
	}
	now := time.Now()
	for _, st := range shown {
		sv := stepView{Step: st, Output: prettyJSON(st.Output), Started: uiTime(strOr(st.StartedAt)),
			Took: duration(strOr(st.StartedAt), strOr(st.EndedAt), now)}
		if l := logs[st.Name]; l != nil {
			sv.Log = *l
		}
		sv.LogShown = sv.Log.Lines > 0 || st.Status == "running"
		sv.LogOpen = st.Status == "running" || st.Status == "failed"
		v.Steps = append(v.Steps, sv)
	}
	v.Timeline = buildTimeline(run, now)
	for _, sg := range run.Inbox {
		if sg.ConsumedBy == "" {
			v.Pending = append(v.Pending, sg)
		}
	}
	v.Created, v.Started, v.Ended = uiTime(run.CreatedAt), uiTime(strOr(run.StartedAt)), uiTime(strOr(run.EndedAt))
	v.Took = duration(strOr(run.StartedAt), strOr(run.EndedAt), now)
	if run.Deadline != nil {
		v.Deadline = uiTime(run.Deadline.At)
	}
	return "run", "Run " + run.ID, v, nil
}

// prettyJSON is an output indented, with its strings as they are (the state stores
// "<" as \u003c; the page shows "<", escaped by the template like everything else).
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // an int64 stays as it was
	var v any
	if dec.Decode(&v) != nil {
		return string(raw)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if enc.Encode(v) != nil {
		return string(raw)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

type workflowsView struct {
	Workflows []client.Workflow
	Schedules map[string]client.CronEntry
}

func (s *Server) workflowsPage(r *http.Request) (string, string, any, error) {
	ws, err := do[[]client.Workflow](r.Context(), s.cfg.Backend, "workflow.list", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	cron, err := do[[]client.CronEntry](r.Context(), s.cfg.Backend, "cron.list", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	v := workflowsView{Workflows: ws, Schedules: map[string]client.CronEntry{}}
	for _, c := range cron {
		v.Schedules[c.Workflow] = c
	}
	return "workflows", "Workflows", v, nil
}

type workflowView struct {
	Name     string
	Versions []client.Workflow // newest first
	Schedule *client.CronEntry
}

func (s *Server) workflowPage(r *http.Request) (string, string, any, error) {
	name := r.PathValue("name")
	vs, err := s.cfg.Backend.Versions(name)
	if err != nil {
		return "", "", nil, &client.Error{Code: client.CodeNotFound, Message: err.Error()}
	}
	v := workflowView{Name: name}
	for i := len(vs) - 1; i >= 0; i-- {
		v.Versions = append(v.Versions, vs[i])
	}
	cron, err := do[[]client.CronEntry](r.Context(), s.cfg.Backend, "cron.list", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	for i := range cron {
		if cron[i].Workflow == name {
			v.Schedule = &cron[i]
		}
	}
	return "workflow", "Workflow " + name, v, nil
}

// cronTicks is how many fire times the cron page shows per schedule.
const cronTicks = 50

func (s *Server) cronPage(r *http.Request) (string, string, any, error) {
	cron, err := do[[]client.CronEntry](r.Context(), s.cfg.Backend, "cron.list", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	for i := range cron {
		if cron[i].Last, err = s.cfg.Backend.Ticks(cron[i].Workflow, cronTicks); err != nil {
			return "", "", nil, err
		}
	}
	return "cron", "Cron", cron, nil
}

func (s *Server) dlqPage(r *http.Request) (string, string, any, error) {
	runs, err := do[[]client.Run](r.Context(), s.cfg.Backend, "dlq.list", client.Request{Limit: 1000})
	if err != nil {
		return "", "", nil, err
	}
	return "dlq", "Dead-letter queue", runs, nil
}

func (s *Server) purgeConfirmPage(r *http.Request) (string, string, any, error) {
	run, err := do[client.Run](r.Context(), s.cfg.Backend, "dlq.show", client.Request{ID: r.PathValue("id")})
	if err != nil {
		return "", "", nil, err
	}
	return "purge", "Purge " + run.ID, run, nil
}

type clusterView struct {
	Status client.ClusterStatus
	Lag    map[string]uint64
}

func (s *Server) clusterPage(r *http.Request) (string, string, any, error) {
	st, err := do[client.ClusterStatus](r.Context(), s.cfg.Backend, "cluster.status", client.Request{})
	if err != nil {
		return "", "", nil, err
	}
	v := clusterView{Status: st, Lag: map[string]uint64{}}
	for _, n := range st.Nodes {
		if st.LastSeq > n.Applied {
			v.Lag[n.ID] = st.LastSeq - n.Applied
		}
	}
	return "cluster", "Cluster", v, nil
}

// streamWriteTimeout bounds each write of a live stream (a browser that stops reading
// ends its stream), in place of the server's write timeout, which would end a stream
// that lasts longer.
const streamWriteTimeout = 30 * time.Second

// funcs for the templates.
var funcs = template.FuncMap{
	"pathEscape": url.PathEscape,
	"when":       timeTag,
	"statusWord": func(s string) string { return strings.ReplaceAll(s, "_", " ") },
	"add":        func(a, b int) int { return a + b },
}
