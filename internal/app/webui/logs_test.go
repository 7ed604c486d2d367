package webui

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flow/client"
	"github.com/flowrun/flow/engine"
	"github.com/flowrun/flow/internal/app/apiserver"
)

// The steps' logs on the run page (docs/ui.md, "Step logs"): the page's first render,
// the JSON its script follows, and the guards of both.

// logsOf is GET /ui/runs/{id}/logs?after= as the page's script reads it: the status,
// the page (on 200) and the body as it came.
func logsOf(t *testing.T, c *http.Client, base, id, query string) (int, client.StepLogPage, string) {
	t.Helper()
	resp, err := c.Get(base + "/ui/runs/" + url.PathEscape(id) + "/logs" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var page client.StepLogPage
	if resp.StatusCode == http.StatusOK {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("the logs are sent as %q", ct)
		}
		if err := json.Unmarshal(b, &page); err != nil {
			t.Fatalf("the logs' JSON %q: %v", b, err)
		}
	}
	return resp.StatusCode, page, string(b)
}

func texts(lines []client.LogLine) []string {
	var out []string
	for _, l := range lines {
		out = append(out, l.Stream+":"+l.Line)
	}
	return out
}

// eventually checks ok until it holds, every 20 ms, for at most 30 s: what it waits
// for (a line in the step logs' stream) wakes nothing the test could wait on.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s", what)
		}
		<-tick.C
	}
}

const talkWorkflow = `name: talk
steps:
  - name: say
    uses: exec
    with:
      command: [sh, -c, 'echo hello; echo "</ol><script>alert(1)</script><img src=x onerror=alert(2)>"; echo oops >&2']
  - name: after
    needs: [say]
    uses: noop
`

// A run's page shows what each step printed in the step's section: stdout and stderr
// (marked), under the header of its epoch and attempt, hostile lines as text; the page
// carries the cursor after its lines, and the JSON the script follows from it has
// nothing more once the run has ended. A step that printed nothing has no log view.
func TestRunPageShowsStepLogs(t *testing.T) {
	n := startNode(t, Config{})
	n.apply(t, talkWorkflow)
	n.runToEnd(t, "talk", "t1")
	c := browser(t)
	code, page := get(t, c, n.srv.URL+"/ui/runs/t1")
	if code != http.StatusOK {
		t.Fatalf("the run page: %d\n%s", code, page)
	}
	view := regexp.MustCompile(`(?s)<details class="log" data-step="say">.*?</details>`).FindString(page)
	if view == "" { // collapsed (no open), shown (no hidden)
		t.Fatalf("the step say has no log view, or one open or hidden (want it collapsed, as outputs are):\n%s", page)
	}
	epoch := runEpoch(t, n, "t1")
	for _, want := range []string{
		"<summary>Log of say</summary>",
		fmt.Sprintf(`<p class="loghead">epoch %d · attempt 1</p>`, epoch),
		`<span class="tag"></span><span class="lt">hello</span>`,
		`<li class="ls-stderr"><time datetime="20`,
		`<span class="tag">stderr</span><span class="lt">oops</span>`,
		"&lt;/ol&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("the log view lacks %q:\n%s", want, view)
		}
	}
	for _, raw := range []string{"<script>alert", "<img src=x", "</ol><script>"} {
		if strings.Contains(page, raw) {
			t.Errorf("the run page shows %q unescaped", raw)
		}
	}
	if !regexp.MustCompile(`<details class="log" data-step="after" hidden>`).MatchString(page) {
		t.Errorf("the noop step's log view is not hidden")
	}
	m := regexp.MustCompile(`data-logs="/ui/runs/t1/logs" data-log-after="(\d+)" data-log-lines="3"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the page does not carry its cursor and its 3 lines:\n%s", page)
	}

	// The JSON: the same three lines from the start, then nothing after the page's cursor.
	code, all, body := logsOf(t, c, n.srv.URL, "t1", "")
	if code != http.StatusOK || len(all.Lines) != 3 || all.Next != m[1] || !all.Ended {
		t.Fatalf("the logs from the start: %d %+v (the page's cursor %s)", code, all, m[1])
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, `\u003cscript\u003e`) {
		t.Errorf("the JSON sends markup as it is: %s", body)
	}
	// stdout in its order; stderr, another pipe, anywhere among it.
	got := texts(all.Lines)
	if out := slices.DeleteFunc(slices.Clone(got), func(s string) bool { return s == "stderr:oops" }); len(out) != 2 || out[0] != "stdout:hello" ||
		out[1] != "stdout:</ol><script>alert(1)</script><img src=x onerror=alert(2)>" {
		t.Errorf("the lines are %q", got)
	}
	code, rest, _ := logsOf(t, c, n.srv.URL, "t1", "?after="+m[1])
	if code != http.StatusOK || len(rest.Lines) != 0 || !rest.Ended || rest.Next != m[1] {
		t.Fatalf("after the page's cursor: %d %+v; want no line, the run ended, the same cursor", code, rest)
	}
	code, one, _ := logsOf(t, c, n.srv.URL, "t1", "?step=say")
	if code != http.StatusOK || len(one.Lines) != 3 {
		t.Fatalf("the step say's logs: %d %+v", code, one)
	}
	code, none, _ := logsOf(t, c, n.srv.URL, "t1", "?step=after")
	if code != http.StatusOK || len(none.Lines) != 0 || string(mustJSON(t, none.Lines)) != "[]" {
		t.Fatalf("the step after's logs: %d %+v; want [] lines", code, none)
	}
}

// runEpoch is run id's epoch: on a test's one node, the epoch its steps ran in (not
// necessarily 1: the count starts before a node claims the run).
func runEpoch(t *testing.T, n *testNode, id string) int64 {
	t.Helper()
	r, err := n.e.API().Run(id)
	if err != nil {
		t.Fatal(err)
	}
	return r.Epoch
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The logs' JSON refuses what the page never sends with 400 and why: a cursor that is
// not one and a step name that is not one before anything is read, a step the run does
// not have; an unknown run is 404.
func TestStepLogsRefuseBadInput(t *testing.T) {
	n := startNode(t, Config{})
	n.apply(t, talkWorkflow)
	n.runToEnd(t, "talk", "t1")
	c := browser(t)
	for _, tc := range []struct {
		id, query string
		code      int
		want      string
	}{
		{"t1", "?after=abc", 400, `cursor "abc" is not one this page was given`},
		{"t1", "?after=-1", 400, "cursor"},
		{"t1", "?after=" + strings.Repeat("9", 300), 400, "…"},
		{"t1", "?step=Say%20it", 400, `step "Say it" is not a step name`},
		{"t1", "?step=nope", 400, `run t1 has no step "nope"`},
		{"t2", "", 404, "t2"},
		{"t2", "?step=say", 404, "t2"},
	} {
		code, _, body := logsOf(t, c, n.srv.URL, tc.id, tc.query)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s%s: %d %q; want %d saying %q", tc.id, tc.query, code, body, tc.code, tc.want)
		}
	}
}

// A running step's lines reach the page as the step prints them: the page shows the
// first, open, with the cursor after it; the JSON after that cursor has the next line
// and not the first again; once the run has ended a page after the last cursor is
// empty and says so.
func TestStepLogsFollowARunningStep(t *testing.T) {
	n := startNode(t, Config{})
	gate := filepath.Join(t.TempDir(), "gate")
	n.apply(t, fmt.Sprintf(`name: slowtalk
steps:
  - name: say
    uses: exec
    with:
      command: [sh, -c, 'echo first; while [ ! -e %s ]; do sleep 0.02; done; echo second >&2']
`, gate))
	if _, err := n.e.StartRun(ctxT(t), "slowtalk", nil, engine.RunOptions{ID: "s1"}); err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	var page string
	eventually(t, "the run page to show the first line", func() bool {
		_, page = get(t, c, n.srv.URL+"/ui/runs/s1")
		return strings.Contains(page, `<span class="lt">first</span>`)
	})
	if !strings.Contains(page, `<details class="log" data-step="say" open>`) {
		t.Errorf("a running step's log view is not open:\n%s", page)
	}
	cursor := regexp.MustCompile(`data-log-after="(\d+)" data-log-lines="1"`).FindStringSubmatch(page)
	if cursor == nil {
		t.Fatalf("the page does not carry the cursor after its one line:\n%s", page)
	}
	code, p, _ := logsOf(t, c, n.srv.URL, "s1", "?after="+cursor[1])
	if code != http.StatusOK || len(p.Lines) != 0 || p.Ended {
		t.Fatalf("after the first line, before the second: %d %+v; want no line, the run going on", code, p)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	after := cursor[1]
	var got []client.LogLine
	ended := false
	eventually(t, "the second line and the run's end", func() bool {
		code, p, body := logsOf(t, c, n.srv.URL, "s1", "?after="+after)
		if code != http.StatusOK {
			t.Fatalf("following: %d %s", code, body)
		}
		got, after = append(got, p.Lines...), p.Next
		ended = p.Ended && len(p.Lines) == 0
		return ended
	})
	if texts := texts(got); len(texts) != 1 || texts[0] != "stderr:second" {
		t.Fatalf("after the first line's cursor the logs had %q; want the second line alone", texts)
	}
	if l, epoch := got[0], runEpoch(t, n, "s1"); l.Step != "say" || l.Attempt != 1 || l.Epoch != epoch || l.Item != nil {
		t.Errorf("the second line is %+v; want step say, attempt 1, the run's epoch %d, no item", l, epoch)
	}
}

// The logs' JSON needs the run page's sign-in: without it (or after signing out) 401
// and no line; a viewer reads them.
func TestStepLogsNeedTheSignIn(t *testing.T) {
	n := startPeopleNode(t)
	n.apply(t, talkWorkflow)
	n.runToEnd(t, "talk", "t1")
	anon := browser(t)
	if code, _ := get(t, anon, n.srv.URL+"/ui/runs/t1"); code != http.StatusSeeOther {
		t.Fatalf("the run page signed out: %d, want the sign-in's redirect", code)
	}
	code, _, body := logsOf(t, anon, n.srv.URL, "t1", "")
	if code != http.StatusUnauthorized || strings.Contains(body, "hello") || !strings.Contains(body, "sign in") {
		t.Fatalf("the logs signed out: %d %q; want 401 and no line", code, body)
	}
	vera := browser(t)
	if code, _ := post(t, vera, n.srv.URL+"/ui/login", url.Values{"user": {"vera"}, "password": {"v-pw"}, "next": {"/ui/runs/t1"}}, nil); code != http.StatusSeeOther {
		t.Fatalf("vera's sign-in: %d", code)
	}
	if code, p, body := logsOf(t, vera, n.srv.URL, "t1", ""); code != http.StatusOK || len(p.Lines) != 3 {
		t.Fatalf("a viewer's logs: %d %s", code, body)
	}
	_, page := get(t, vera, n.srv.URL+"/ui/runs/t1")
	if code, _ := post(t, vera, n.srv.URL+"/ui/logout", url.Values{"csrf": {csrfOf(t, page)}}, nil); code != http.StatusSeeOther {
		t.Fatalf("vera's sign-out: %d", code)
	}
	if code, _, body := logsOf(t, vera, n.srv.URL, "t1", ""); code != http.StatusUnauthorized || strings.Contains(body, "hello") {
		t.Fatalf("the logs after signing out: %d %q", code, body)
	}
}

// logsBackend answers a run page from fixed answers: a run of one step whose log has
// lines of two epochs, a zombie's among them, as no engine in a test's time makes them.
type logsBackend struct {
	countingBackend
	run  client.Run
	logs client.StepLogPage
}

func (b *logsBackend) Do(_ context.Context, op string, req client.Request) (any, error) {
	switch op {
	case "run.get":
		return b.run, nil
	case "run.history":
		return []client.Event{}, nil
	case "run.logs":
		return b.logs, nil
	}
	return nil, &client.Error{Code: client.CodeBadRequest, Message: "not in the test: " + op}
}

func (b *logsBackend) StepNeeds(string, int) ([]apiserver.StepNeeds, error) {
	return []apiserver.StepNeeds{{Name: "work"}}, nil
}

// A step's lines are shown by epoch, item and attempt, each block under its header,
// whatever order the log has them in (a zombie's last lines, under its old epoch, come
// after those of the epoch that replaced it); flow's own lines are marked as notes; a
// stream the page does not know is "other", never a class taken from the data; a line's
// time is the UTC time of day, with the whole time on hover.
func TestStepLogsAreGroupedByEpochAndAttempt(t *testing.T) {
	item := func(i int) *int { return &i }
	at := "2026-12-05T12:55:22.123456789Z"
	lines := []client.LogLine{
		{Step: "work", Attempt: 1, Epoch: 2, Stream: "stdout", Line: "new owner", At: at},
		{Step: "work", Attempt: 1, Epoch: 1, Stream: "stdout", Line: "zombie", At: at},
		{Step: "work", Attempt: 1, Epoch: 1, Stream: "flow", Line: "stopped: its epoch ended", At: at},
		{Step: "work", Attempt: 2, Epoch: 2, Item: item(0), Stream: "stderr", Line: "item retry", At: at},
		{Step: "work", Attempt: 1, Epoch: 2, Item: item(0), Stream: `x"><script>`, Line: "odd", At: "not a time"},
	}
	ui, err := New(Config{Backend: &logsBackend{
		run:  client.Run{ID: "z1", Workflow: "wf", Version: 1, Status: "succeeded", Epoch: 2, Steps: []client.Step{{Name: "work", Status: "succeeded", Epoch: 2}}},
		logs: client.StepLogPage{Lines: lines, Next: "17", Ended: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ui.Close)
	w := serve(ui, http.MethodGet, "/ui/runs/z1", "127.0.0.1:8080", "127.0.0.1:5555", nil, nil)
	if w.Code != http.StatusOK {
		t.Fatalf("the run page: %d\n%s", w.Code, w.Body)
	}
	page := w.Body.String()
	heads := regexp.MustCompile(`<p class="loghead">([^<]*)</p>`).FindAllStringSubmatch(page, -1)
	var got []string
	for _, h := range heads {
		got = append(got, h[1])
	}
	want := []string{"epoch 1 · attempt 1", "epoch 2 · attempt 1", "epoch 2 · item 0 · attempt 1", "epoch 2 · item 0 · attempt 2"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("the blocks are %q; want %q", got, want)
	}
	zombie := strings.Index(page, ">zombie<")
	if zombie < 0 || zombie > strings.Index(page, "epoch 2 · attempt 1") {
		t.Errorf("the zombie's line is not under its own epoch's header")
	}
	for _, want := range []string{
		`data-key="1/-1/1"`, `data-key="2/0/2"`,
		`<li class="ls-flow"><time datetime="2026-12-05T12:55:22.123Z" title="2026-12-05 12:55:22.123 UTC" data-clock>12:55:22</time><span class="tag">flow</span><span class="lt">stopped: its epoch ended</span></li>`,
		`<li class="ls-other"><time data-clock>--:--:--</time><span class="tag">other</span><span class="lt">odd</span></li>`,
		`<li class="ls-stderr">`,
		`data-log-after="17" data-log-lines="5"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Errorf("a stream's name is in the page as markup")
	}
}
