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
	s.render(w, r, se, "error", code, viewOf(se, s.authEnabled(), http.StatusText(code), errorView{Code: code, Message: err.Error()}))
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
	Runs       []client.Run
	Workflows  []string
	Workflow   string
	Status     string
	Statuses   []string
	Query      string
	Next       string // cursor of the next (older) page
	NextURL    string
	FirstURL   string
	SearchNote string
}

const pageSize = 50

func (s *Server) runsPage(r *http.Request) (string, string, any, error) {
	q := r.URL.Query()
	v := runsView{Workflow: q.Get("workflow"), Status: q.Get("status"), Query: strings.TrimSpace(q.Get("q")), Statuses: runStatuses}
	if v.Status != "" && !slices.Contains(runStatuses, v.Status) {
		return "", "", nil, badInput("status %q: use one of %s", v.Status, strings.Join(runStatuses, ", "))
	}
	if len(v.Query) > 256 || len(v.Workflow) > 256 || len(q.Get("before")) > 512 {
		return "", "", nil, badInput("a filter of at most 256 characters is expected")
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
	if v.Query != "" {
		v.Runs, err = s.cfg.Backend.RunsWithIDPrefix(ctx, v.Query, pageSize)
		if err != nil {
			return "", "", nil, err
		}
		v.SearchNote = fmt.Sprintf("runs whose ID starts with %q", v.Query)
		return "runs", "Runs", v, nil
	}
	v.Runs, v.Next, err = s.cfg.Backend.RunsPage(ctx, v.Workflow, v.Status, q.Get("before"), pageSize)
	if err != nil {
		return "", "", nil, err
	}
	filter := url.Values{}
	if v.Workflow != "" {
		filter.Set("workflow", v.Workflow)
	}
	if v.Status != "" {
		filter.Set("status", v.Status)
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
}

type stepView struct {
	client.Step
	Output string // pretty JSON
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
	v.Graph = layout(needs, run.Steps)
	for _, st := range run.Steps {
		v.Steps = append(v.Steps, stepView{Step: st, Output: prettyJSON(st.Output)})
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
	"statusWord": func(s string) string { return strings.ReplaceAll(s, "_", " ") },
	"add":        func(a, b int) int { return a + b },
}
